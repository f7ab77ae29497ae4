"""The one handler of replies to a gate's mail, whichever way they come in.

A reply decides only when all of this holds: it is addressed to a reply address this
Tollgate signed (person, gate, attempt, evidence); it comes from that person's own address,
authenticated for its domain (`authenticity`); it is a person's reply, not an auto-reply or a
forward; its Message-ID was never handled before; the gate still waits, on the same attempt
and the same evidence, and can be decided without a signature or a form; and its first line
says approve or reject. It then decides through the same engine call as every channel,
recorded as a mail reply with its Message-ID. Otherwise nothing is decided and the person the
address names is told why, with the link to the gate (never the sender: a forged sender must
not be mailed). The message's record, the decision and the answer are one transaction."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from workflows import engine
from workflows.delivery import links, notifications
from workflows.errors import WorkflowError
from workflows.models import Channel, MailReply, Notification, Step, StepKind, StepStatus
from workflows.people import permissions
from workflows.reads import briefs
from workflows.timing import clock
from workflows.timing.timezones import zone_of

from . import authenticity, reading

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Received:
    decided: bool
    outcome: str  # what was done, or why nothing was
    answered: bool = False  # a mail telling the person was recorded


def _addressed(message: EmailMessage, recipient: str) -> links.ReplyTo | None:
    for address in ([recipient] if recipient else []) + reading.recipients(message):
        if found := links.read_reply_address(address):
            return found
    return None


def receive(raw: bytes, *, via: str, recipient: str = "",
            message: EmailMessage | None = None) -> Received:
    """Handle one message as it came in (`raw`, its bytes; `message`, parsed, when the
    caller has it; `recipient`, the envelope's, when the mail server gives it)."""
    message = message or message_from_bytes(raw, policy=policy.default)
    to = _addressed(message, recipient)
    if to is None:
        log.info("A mail to no reply address of this Tollgate (or an altered one): dropped")
        return Received(False, "not addressed to a reply address of this Tollgate")
    message_id = str(message.get("Message-ID", "")).strip()[:300]
    if not message_id:
        return Received(False, "it has no Message-ID, so it could not be told from a replay")
    user = get_user_model().objects.filter(pk=to.user_id, is_active=True).first()
    step = (Step.objects.select_related("run", "run__spec", "run__requested_by")
            .filter(pk=to.step_id, kind=StepKind.APPROVAL).first())
    said = reading.answer(message)
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = MailReply.objects.create(
                    message_id=message_id, sender=str(message.get("From", ""))[:300], via=via,
                    user=user, step=step, attempt=to.attempt, decision=said.decision,
                    outcome="")
        except IntegrityError:
            return Received(False, f"{message_id} was handled before: a replay, not answered")
        decided, outcome, answer = _decide(raw, message, to, user, step, said, message_id)
        if answer and not decided and _refused_lately(user, row) >= REFUSALS_ANSWERED:
            # Whoever holds a person's reply address could have them mailed without end.
            answer = False
            outcome += (f" (not answered: {REFUSALS_ANSWERED} refused replies in the last "
                        "hour were answered already)")
        row.decided, row.outcome = decided, outcome
        row.save(update_fields=["decided", "outcome"])
        note = _answer(row, user, step, message, outcome, decided) if answer else None
    log.info("Mail reply %s from %s: %s", message_id, row.sender, outcome)
    if note is not None:
        notifications.send(note.pk)
    return Received(decided, outcome, note is not None)


# A person is answered for at most this many refused replies an hour.
REFUSALS_ANSWERED = 10


def _refused_lately(user, row: MailReply) -> int:
    """How many of this person's replies were refused in the last hour, before this one."""
    return (MailReply.objects.filter(user=user, decided=False,
                                     received_at__gte=clock.now() - timedelta(hours=1))
            .exclude(pk=row.pk).count())


def _decide(raw, message, to, user, step, said, message_id) -> tuple[bool, str, bool]:
    """(decided, what was done or why not, whether to answer the person)."""
    if auto := reading.auto_reply(message):
        return False, f"an automatic reply ({auto}): nothing decided", False
    if user is None or not user.email:
        return False, "its address names no active person with a mail address", False
    sender = authenticity.sender(message)
    if sender != user.email.strip().lower():
        return False, (f"it came from {sender or 'no single sender'}, not from "
                       f"{user.email}, the address this reply address was made for"), True
    if reading.forwarded(message):
        return False, "it is a forward of the mail, not a reply to it", True
    domain = sender.rpartition("@")[2]
    if not authenticity.aligned(domain, authenticity.vouched_domains(raw, message)):
        return False, (f"it could not be verified as yours: no DKIM signature of {domain} "
                       "verified, and no relay this Tollgate trusts vouched for it"), True
    if not permissions.vouched_for(user):
        return False, permissions.NOT_VOUCHED_FOR, True
    if step is None:
        return False, "its gate no longer exists", True
    if step.run.is_terminal or step.status != StepStatus.WAITING_APPROVAL:
        return False, f"{step.title} is {step.get_status_display().lower()}, not waiting", True
    if step.attempt != to.attempt:
        return False, f"{step.title} has started again since that mail", True
    if not step.evidence_digest.startswith(to.shown):
        return False, (f"{step.title} changed after that mail was written (the run's values "
                       "or outputs moved on): look again at what it shows now"), True
    briefs.gate_evidence([step])
    if why := briefs.page_only(step):
        return False, f"{step.title} cannot be decided by a reply: {why}", True
    if not said.decision:
        return False, (f"its first line ({said.first_line!r}) says neither approve nor "
                       "reject" if said.first_line else "it has no text before the quoted "
                       "mail"), True
    try:
        with transaction.atomic():
            decide = engine.approve if said.decision == "approve" else engine.reject
            decide(step.run_id, step.key, user=user, comment=said.comment,
                   channel=Channel.MAIL_REPLY, chat_identity=message_id,
                   seen=step.evidence_digest)
    except WorkflowError as exc:
        return False, f"not recorded: {exc}", True
    verb = "approved" if said.decision == "approve" else "rejected"
    return True, briefs.you_decided(verb, step.title), True


def _answer(row: MailReply, user, step, message, outcome: str, decided: bool) -> Notification:
    """The mail telling the person what became of their reply, in its thread."""
    waiting = (step is not None and not decided and step.status == StepStatus.WAITING_APPROVAL
               and not step.run.is_terminal)
    context = {"user": user, "step": step, "outcome": outcome, "decided": decided,
               "sender": row.sender, "received": row.received_at,
               "decide_link": links.decision_url(user, step) if waiting else "",
               "run_link": links.absolute(step.run.get_absolute_url()) if step else ""}
    text, html = notifications.render("reply_answer", context, zone_of(user))
    subject = str(message.get("Subject", "")).strip()
    subject = subject if subject.lower().startswith("re:") else f"Re: {subject}".strip()
    return Notification.objects.create(
        user=user, key=f"reply:{row.pk}", event="mail_reply", run=step.run if step else None,
        subject=subject[:300], body=text, html=html, next_attempt_at=clock.now(),
        headers={"In-Reply-To": row.message_id, "References": row.message_id,
                 "Auto-Submitted": "auto-replied"})

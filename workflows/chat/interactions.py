"""A press in chat: verified, recorded and acknowledged at once (Slack wants an answer within
3 seconds), then decided after, by a worker, through the same engine call as the web.

What must happen inside the request happens there and nothing more: a button that needs the
gate's form opens it (the platform's trigger lasts 3 seconds), and a submitted form whose
fields are wrong is shown its errors. The decision itself is a `ChatInteraction` row handled
by `handle`: a worker that dies loses nothing, and a replayed request is refused by its
unique signature."""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import timedelta

from django.db import IntegrityError, transaction

from workflows import engine
from workflows.errors import InvalidInput, WorkflowError
from workflows.models import (
    Channel,
    ChatInteraction,
    ChatMessage,
    Step,
    StepKind,
    StepStatus,
)
from workflows.people import permissions
from workflows.reads import gates as gates_seen
from workflows.timing import clock

from . import identities, messages, providers
from .base import Press, Refused, Viewer
from .messages import gate_message

log = logging.getLogger(__name__)

RETRY_SECONDS = (10, 60, 300, 1800, 3600)
CLAIM_SECONDS = 120


def _gate(step_id: int) -> Step | None:
    return (Step.objects.select_related("run", "run__spec", "run__requested_by")
            .filter(pk=step_id, kind=StepKind.APPROVAL).first())


def _waiting(gate: Step | None, press: Press) -> bool:
    return (gate is not None and gate.attempt == press.attempt and not gate.run.is_terminal
            and gate.status == StepStatus.WAITING_APPROVAL)


def _form_errors(gate: Step | None, press: Press) -> dict[str, str]:
    if not _waiting(gate, press):
        return {}  # handled after: the person is told the gate moved on
    if press.decision == "reject":
        return {} if press.comment.strip() else {"comment": "A comment is required to reject."}
    try:
        engine.form_values(gate, press.values)
    except InvalidInput as exc:
        return getattr(exc, "errors", None) or {"comment": str(exc)}
    return {}


def _done(row: ChatInteraction, outcome: str) -> None:
    ChatInteraction.objects.filter(pk=row.pk).update(done_at=clock.now(), outcome=outcome)


def receive(chat, headers, body: bytes) -> tuple[dict | None, int | None]:
    """Take one request from the platform: (what to answer it with, or None for an empty
    200; the interaction to handle after answering, if any). Raises Refused for a request
    that is not the platform's, or that came before."""
    digest = chat.verify(headers, body)
    kind, payload = chat.parse(body)
    press = chat.press_of(payload)
    try:
        with transaction.atomic():
            row = ChatInteraction.objects.create(
                provider=chat.name, digest=digest,
                payload={"kind": kind, "press": asdict(press) if press else None})
    except IntegrityError:
        raise Refused("This request was received before: a replay is refused.") from None
    if press is None:
        _done(row, f"not a Tollgate press ({kind})")
        return None, None
    gate = _gate(press.step_id)
    if press.kind == "view":
        if gate is None or not _may_view(chat, press, gate):
            _done(row, "view refused: not posted there, or not the person's to read")
            return None, None
        _done(row, "viewed")
        messages.adopt(chat, press)
        return chat.view(press, gate_message(gate), viewer(chat, press, gate)), None
    needs_form = press.decision == "reject" or bool(
        gate is not None and gate.config.get("approval", {}).get("form"))
    if press.kind == "button" and needs_form and _waiting(gate, press):
        try:
            # Someone chat cannot match is told so (with the link) before filling in a
            # form that could not be recorded.
            if _who(chat, press) is None:
                _done(row, "not linked")
            else:
                chat.open_form(press, gate_message(gate))
                _done(row, "form opened")
        except Exception as exc:  # the platform away: the person presses again
            log.warning("Could not open the form for %s: %s", press, exc)
            _done(row, f"form not opened: {exc}"[:2000])
        return None, None
    if press.kind == "form" and (errors := _form_errors(gate, press)):
        if _who(chat, press) is None:  # the link first: the form could not be recorded
            _done(row, "not linked")
            return chat.view(press, gate_message(gate), viewer(chat, press, gate)), None
        _done(row, f"form refused: {errors}"[:2000])
        return chat.form_errors(errors, press, gate_message(gate)), None
    messages.adopt(chat, press)
    return chat.ack(press), row.pk


def _may_view(chat, press: Press, gate: Step) -> bool:
    """A card is shown again only where it was posted (a refresh names any step id it
    likes) and, to a person Tollgate knows, only if they may read its run
    (TOLLGATE_RUN_VISIBILITY), as on the web."""
    conversation = press.channel.split(";")[0]
    if not ChatMessage.objects.filter(step=gate, provider=chat.name,
                                      channel=conversation).exists():
        return False
    identity = _match(chat, press)
    return identity is None or permissions.readable_runs(identity.user).filter(
        pk=gate.run_id).exists()


def viewer(chat, press: Press, gate: Step) -> Viewer:
    """What the person who asked to see the gate may do with it now (a platform that
    shows each person their own view, as Teams' refresh does)."""
    identity = _match(chat, press)
    if identity is None:
        return Viewer(linked=False, link_url=identities.link_url(
            chat.name, press.team, press.chat_user, press.chat_name, chat.email_of(press)))
    gates_seen.seen_by(identity.user, [gate], brief=False, audience=False)
    if gate.refusal:
        return Viewer(linked=True, refusal=gate.refusal)
    return Viewer(linked=True, signature=gate.signing)


def _match(chat, press: Press):
    """The Tollgate user a chat account acts as: linked already, or matched now by the
    directory id or the verified e-mail sign-on gave (None when neither finds one)."""
    identity = identities.find(chat.name, press.team, press.chat_user)
    if identity is None and (object_id := chat.object_id_of(press)):
        identity = identities.match_by_object_id(chat.name, press.team, press.chat_user,
                                                 press.chat_name, object_id)
    if identity is None:
        identity = identities.match_by_email(chat.name, press.team, press.chat_user,
                                             press.chat_name, chat.email_of(press))
    return identity


def _who(chat, press: Press):
    """The Tollgate user a chat account acts as (`_match`), or None after telling the
    person, privately, how to link it."""
    identity = _match(chat, press)
    if identity is None:
        url = identities.link_url(chat.name, press.team, press.chat_user, press.chat_name,
                                  chat.email_of(press))
        chat.tell(press,
                  "Tollgate does not know which of its users you are, so nothing was "
                  f"recorded. Open this link while signed in to Tollgate to link your "
                  f"account, then press again: {url}")
        return None
    if not (identity.user.is_active and permissions.vouched_for(identity.user)):
        # Removed or disabled at the company's provider: as its tokens and sessions, its
        # chat accounts act no more.
        chat.tell(press, permissions.NOT_VOUCHED_FOR if identity.user.is_active else
                  "Your Tollgate account is deactivated: nothing was recorded.")
        return None
    return identity


def _decide(chat, press: Press) -> str:
    identity = _who(chat, press)
    if identity is None:
        return "not linked"
    gate = _gate(press.step_id)
    if not _waiting(gate, press):
        what = "no longer exists" if gate is None else (
            "has started again since this message" if gate.attempt != press.attempt
            else f"is {gate.get_status_display().lower()}, not waiting")
        chat.tell(press, f"Nothing was recorded: this gate {what}.")
        return f"refused: gate {what}"
    try:
        if press.decision == "approve":
            engine.approve(gate.run_id, gate.key, user=identity.user, comment=press.comment,
                           values=press.values or None, channel=Channel.CHAT,
                           chat_identity=identity.label, seen=press.seen)
        else:
            engine.reject(gate.run_id, gate.key, user=identity.user, comment=press.comment,
                          channel=Channel.CHAT, chat_identity=identity.label, seen=press.seen)
    except WorkflowError as exc:
        chat.tell(press, f"Not recorded: {exc}")
        return f"refused: {exc}"[:2000]
    return f"{'approved' if press.decision == 'approve' else 'rejected'} by {identity.user}"


def handle(chat, interaction_id: int, now=None) -> str:
    """Decide one recorded press, if it is due (claimed first: two workers never handle it
    at once). The platform being away is retried with backoff; the engine's own rules (one
    decision per person and attempt) make a repeat harmless."""
    now = now or clock.now()
    claimed = ChatInteraction.objects.filter(
        pk=interaction_id, done_at__isnull=True, next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    row = ChatInteraction.objects.filter(pk=interaction_id).first()
    if not claimed or row is None:
        return "not due"
    try:
        outcome = _decide(chat, Press(**row.payload["press"]))
    except Exception as exc:
        attempts = row.attempts + 1
        wait = RETRY_SECONDS[min(attempts, len(RETRY_SECONDS)) - 1]
        ChatInteraction.objects.filter(pk=row.pk).update(
            attempts=attempts, next_attempt_at=clock.now() + timedelta(seconds=wait),
            outcome=f"{type(exc).__name__}: {exc}"[:2000])
        log.warning("Chat press %s failed (attempt %s); again in %ss", row.pk, attempts, wait,
                    exc_info=True)
        return "retrying"
    ChatInteraction.objects.filter(pk=row.pk).update(done_at=clock.now(), outcome=outcome,
                                                     attempts=row.attempts + 1)
    return outcome


def handle_any(interaction_id: int) -> str:
    """`handle` with the platform the press came from (nothing when it is turned off)."""
    name = (ChatInteraction.objects.filter(pk=interaction_id)
            .values_list("provider", flat=True).first())
    chat = providers.get(name) if name else None
    return handle(chat, interaction_id) if chat is not None else "platform not set up"


def due(now=None, limit: int = 200) -> list[int]:
    """Presses recorded and not handled whose time has come (a lost doorbell, a retry)."""
    now = now or clock.now()
    return list(ChatInteraction.objects.filter(done_at__isnull=True, next_attempt_at__lte=now)
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])

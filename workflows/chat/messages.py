"""A gate's chat messages: posted to its group's channel when it starts waiting, and updated
after every decision (wherever it was made), escalation and end, so no stale button is left
to press. Run from the outbox ("chat" job): Slack being away loses nothing, and every update
renders the gate as it is now, so a late or repeated update is still right."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from workflows.models import (
    ChatIdentity,
    ChatMessage,
    Preference,
    Step,
    StepKind,
    StepStatus,
)
from workflows.people import permissions
from workflows.reads import briefs
from workflows.timing import clock

from .base import AnswerLost, GateMessage

log = logging.getLogger(__name__)

OUTCOMES = {StepStatus.COMPLETED: "Approved", StepStatus.FAILED: "Rejected",
            StepStatus.CANCELLED: "Cancelled with its run", StepStatus.SKIPPED: "Skipped"}


def gate_message(gate: Step):
    """The gate as chat shows it, from the card's read model (briefs)."""
    briefs.gate_evidence([gate])
    run = gate.run
    waiting = gate.status == StepStatus.WAITING_APPROVAL and not run.is_terminal
    outcome = ""
    if not waiting:
        outcome = OUTCOMES.get(gate.status, gate.get_status_display())
        if gate.status == StepStatus.FAILED and gate.last_summary:
            outcome = f"Ended: {gate.last_summary}"[:300]
        elif gate.status == StepStatus.WAITING_APPROVAL:
            outcome = f"No longer waits: the run is {run.get_status_display().lower()}"
        approvals = [d for d in gate.decisions if d.decision == "approve"]
        # A gate of several stages says for whom each approval counted.
        staged = len({d.rule_id for d in approvals}) > 1
        deciders = ", ".join(
            f"{d.user} ({next((r.audience for r in gate.rules if r.pk == d.rule_id), d.group)})"
            if staged else str(d.user) for d in approvals)
        if gate.status == StepStatus.COMPLETED and deciders:
            outcome = f"Approved by {deciders}"
    trail = []
    for entry in gate.trail:
        values = "; ".join(f"{v['name']} = {v['value']}" + (
            f" (changed by {v['changed_by']}; {entry['title']} wrote {v['was']})"
            if v["was"] else "") for v in entry["values"])
        trail.append(f"{entry['title']}: {entry['status']}" + (f"; {values}" if values else ""))
    return GateMessage(
        step_id=gate.pk, attempt=gate.attempt, title=gate.title,
        group=gate.waits_on if waiting else gate.approval_group,
        run_title=str(run), run_url=f"{settings.TOLLGATE_BASE_URL}{run.get_absolute_url()}",
        requested_by=str(run.requested_by or ""),
        params=[(p["name"], p["whole"]) for p in gate.params], trail=trail,
        instructions=gate.instructions, deadline_at=gate.deadline_at,
        deadline_then=(gate.due or {}).get("then", ""), approved=gate.approved,
        required=gate.approval_required,
        decisions=[f"{d.user} {d.get_decision_display()} via {d.channel_label}"
                   + (f", {d.signature_line}" if d.signature_meaning else "")
                   for d in gate.decisions],
        open=waiting, outcome=outcome,
        has_form=bool(gate.config.get("approval", {}).get("form")),
        form=gate.config.get("approval", {}).get("form") or [],
        deciders=list(permissions.deciders(run, gate).values_list("pk", flat=True))
        if waiting else [], evidence=gate.evidence_digest,
        signature=briefs.signature_to_give(gate)[0] if waiting else "",
        ways_to_sign=briefs.ways_to_sign())


def _claim(chat, gate: Step, channel: str, *, final: bool = False):
    """(this attempt's message row for the channel, whether it was there already), claimed
    so that two deliveries at once send once; None when another delivery holds it, or it was
    sent already."""
    row = ChatMessage.objects.filter(step=gate, attempt=gate.attempt, provider=chat.name,
                                     channel=channel).first()
    retried = row is not None
    if row is None:
        try:
            with transaction.atomic():
                row = ChatMessage.objects.create(step=gate, attempt=gate.attempt,
                                                 provider=chat.name, channel=channel,
                                                 final=final)
        except IntegrityError:
            return None  # another delivery is sending it
    return None if row.ref else (row, retried)


def _post_once(chat, gate: Step, channel: str, message) -> None:
    """Post the gate to a channel unless this attempt is there already. A row left without
    its reference (the platform answered too late, or the worker died before saving it) may
    have been posted: the channel is searched for the message first (it carries the gate and
    attempt) and that one adopted, so a retry posts once."""
    claimed = _claim(chat, gate, channel)
    if claimed is None:
        return
    row, retried = claimed
    if row.posted_at:
        return  # it went out and its answer was lost: a press on it names it (adopt)
    ref = chat.find(channel, gate.pk, gate.attempt) if retried else None
    if ref is None:
        try:
            ref = chat.post(channel, message)
        except AnswerLost as exc:
            log.warning("The post of %s to %s %s went out, its answer lost: %s", gate,
                        chat.name, channel, exc)
            ChatMessage.objects.filter(pk=row.pk).update(posted_at=timezone.now())
            return
    ChatMessage.objects.filter(pk=row.pk).update(ref=ref, posted_at=timezone.now(),
                                                 final=not message.open)


def adopt(chat, press) -> None:
    """A press names the message it came from: a message whose post's answer was lost is
    known by that reference from now on, and updated like any other."""
    if press.ref:
        ChatMessage.objects.filter(
            step_id=press.step_id, attempt=press.attempt, provider=chat.name,
            channel=press.channel.split(";")[0], ref="", posted_at__isnull=False,
        ).update(ref=press.ref[:100])


def sync_gate(chat, gate: Step) -> None:
    """Bring the gate's messages up to date: posted, while it waits, to the channel of its
    group and of each group it waits on now, and every earlier message of it shown as it
    is now."""
    message = gate_message(gate)
    if message.open:
        # Each group it waits on now (a later stage's, or the one it was reassigned to) sees
        # it in its own channel, and the gate's first group keeps its message.
        groups = [gate.approval_group, *(rule.group for rule in gate.open_rules)]
        for channel in dict.fromkeys(chat.channels.get(group, "") for group in groups if group):
            if channel:
                _post_once(chat, gate, channel, message)
        for user_id, text in _personal_notes(gate, message).items():
            _tell_once(chat, gate, user_id, text)
    # This platform's messages only: with Slack and Teams both on, each keeps its own.
    for row in ChatMessage.objects.filter(step=gate, final=False, provider=chat.name
                                          ).exclude(ref=""):
        shown = message if row.attempt == gate.attempt else gate_message_of_attempt(gate, row)
        chat.update(row.channel, row.ref, shown)
        ChatMessage.objects.filter(pk=row.pk).update(updated_at=timezone.now(),
                                                     final=not shown.open)
    # A message whose post's answer was lost, and that no press named since, cannot be
    # updated: once its gate has moved on, the outcome is posted beside it, once.
    for row in ChatMessage.objects.filter(step=gate, final=False, provider=chat.name, ref="",
                                          posted_at__isnull=False):
        shown = message if row.attempt == gate.attempt else gate_message_of_attempt(gate, row)
        if shown.open:
            continue
        try:
            ref = chat.post(row.channel, shown)
        except AnswerLost:
            ref = ""
        ChatMessage.objects.filter(pk=row.pk).update(ref=ref, updated_at=timezone.now(),
                                                     final=True)


def _personal_notes(gate: Step, message) -> dict[int, str]:
    """Who is told directly that the gate waits on them: a person a rule names, and a
    delegate standing in for an approver who is away (for whom, and until when)."""
    run = f"{message.run_title}: {message.run_url}"
    notes = {rule.user_id: f"{gate.title} waits on you. {run}" for rule in gate.open_rules
             if rule.user_id and rule.user_id in message.deciders}
    now = clock.now()
    for away in (Preference.objects.select_related("user")
                 .filter(user_id__in=message.deciders, delegate_id__in=message.deciders,
                         away_from__lte=now, away_until__gt=now)):
        notes[away.delegate_id] = (
            f"You decide {gate.title} for {away.user}, who is away until "
            f"{timezone.localtime(away.away_until):%a %d %b %H:%M %Z}. {run}")
    return notes


def _tell_once(chat, gate: Step, user_id: int, text: str) -> None:
    """A direct message to a person's linked account, once per attempt (the row is claimed
    first; one the platform did not take is tried again with the outbox's retry)."""
    identity = ChatIdentity.objects.filter(provider=chat.name, user_id=user_id).first()
    if identity is None:
        return  # not linked on this platform: mail tells them
    claimed = _claim(chat, gate, f"@{identity.chat_user}"[:100], final=True)
    if claimed is None:
        return
    chat.dm(identity.chat_user, text)
    ChatMessage.objects.filter(pk=claimed[0].pk).update(ref="direct",
                                                        posted_at=timezone.now())


def gate_message_of_attempt(gate: Step, row: ChatMessage):
    """An earlier attempt's message: closed, pointing to the attempt that followed."""
    message = gate_message(gate)
    message.open = False
    message.attempt = row.attempt
    message.outcome = f"Attempt {row.attempt} ended; attempt {gate.attempt} follows"
    return message


def sync(chat, run_id: int, keys: list[str], reminded=()) -> None:
    """The "chat" outbox job: the named gates of a run, and with an empty key (the run
    ended) every gate of it whose message still shows buttons; then a reminder in the
    thread of each `reminded` gate's message, while it still waits."""
    gates = Step.objects.select_related("run", "run__spec", "run__requested_by").filter(
        run_id=run_id, kind=StepKind.APPROVAL)
    named = Q(key__in=[key for key in keys if key])
    if "" in keys:
        named |= Q(pk__in=ChatMessage.objects.filter(step__run_id=run_id, final=False,
                                                     provider=chat.name).values("step_id"))
    for gate in gates.filter(named).order_by("index"):
        sync_gate(chat, gate)
    for gate in gates.filter(key__in=reminded, status=StepStatus.WAITING_APPROVAL):
        message = gate_message(gate)
        if not message.open:
            continue
        for row in ChatMessage.objects.filter(step=gate, attempt=gate.attempt, final=False,
                                              provider=chat.name).exclude(ref=""):
            chat.remind(row.channel, row.ref, message)

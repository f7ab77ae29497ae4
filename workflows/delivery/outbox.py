"""The outbox: what a transition owes the outside world, kept in the database.

A transition that should mail people or post to webhooks writes an OutboxMessage in its own
transaction (the engine's `transition_recording` signal), so the duty commits with the
transition or not at all. After the commit one doorbell delivers it; if the queue was down,
or the worker died, the periodic task rings again for what is due and was not rung recently
(one pending doorbell per message). Delivery is idempotent (one notification per person
and event, one webhook delivery per event), so a repeated attempt sends nothing twice; a
failed one is retried with backoff.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from workflows import engine
from workflows.chat import messages as chat_messages
from workflows.chat import providers as chat_providers
from workflows.delivery import dispatch, notifications, push, webhooks
from workflows.engine import Announcement
from workflows.models import (
    Checkpoint,
    CheckpointKind,
    OutboxJob,
    OutboxMessage,
    StepKind,
    StepStatus,
)
from workflows.timing import clock

log = logging.getLogger(__name__)

BACKOFF_SECONDS = (10, 60, 300, 1800, 3600)
CLAIM_SECONDS = 120  # a claimed message is this long away from being claimed again
GATE_EVENTS = ("gate_waiting", "gate_decided", "gate_escalated", "gate_reassigned")


def notification_events(announcement: Announcement) -> list[tuple[str, str]]:
    """(event, step key) pairs a checkpoint should tell people about."""
    checkpoint = announcement.checkpoint
    events = [("gate_waiting", key) for key in checkpoint.evidence.get("gates_opened", [])]
    step_key = checkpoint.step.key if checkpoint.step_id else ""
    if (checkpoint.kind == CheckpointKind.STEP_RETRIED
            and checkpoint.step_status == StepStatus.WAITING_APPROVAL):
        events.append(("gate_waiting", step_key))
    if checkpoint.evidence.get("stage_opened"):  # the next stage's approvers are told now
        events.append(("gate_waiting", step_key))
    if checkpoint.kind == CheckpointKind.GATE_REASSIGNED:
        events.append(("gate_reassigned", step_key))
    if checkpoint.kind in (CheckpointKind.STEP_APPROVED, CheckpointKind.STEP_REJECTED,
                           CheckpointKind.GATE_TIMED_OUT):
        events.append(("gate_decided", step_key))
    if checkpoint.kind == CheckpointKind.GATE_ESCALATED:
        events.append(("gate_escalated", step_key))
    if checkpoint.kind == CheckpointKind.GATE_REMINDED:
        events.append(("gate_reminded", step_key))
    if announcement.run_failed:
        events.append(("run_failed", step_key))
    return events


def chat_events(announcement: Announcement) -> list[tuple[str, str]]:
    """("gate", key) for each gate whose chat message this checkpoint changes (opened,
    decided, escalated, retried, or its evidence changed), ("remind", key) for a reminder
    (said in the message's thread), and ("run", "") when the run ended (its gates' messages
    lose their buttons)."""
    checkpoint = announcement.checkpoint
    if checkpoint.kind == CheckpointKind.GATE_REMINDED:
        return [("remind", checkpoint.step.key)]  # the message itself has not changed
    keys = set(checkpoint.evidence.get("gates_opened", []))
    keys |= set(checkpoint.evidence.get("gates_changed", []))  # their evidence, re-rendered
    if checkpoint.step_id and checkpoint.step.kind == StepKind.APPROVAL:
        keys.add(checkpoint.step.key)
    events = [("gate", key) for key in sorted(keys)]
    if announcement.run_ended:
        events.append(("run", ""))
    return events


def record(sender, announcements: list[Announcement], **kwargs) -> None:
    """Write the transitions' duties, in their transaction (one statement for all of them):
    mail, webhooks, and the runs they link to (a parent told its child ended, children
    cancelled with their parent)."""
    rows, owners = [], []
    for announcement in announcements:
        owed = duties(announcement)
        rows += owed
        owners += [announcement] * len(owed)
    if rows:
        for owner, row in zip(owners, OutboxMessage.objects.bulk_create(rows), strict=True):
            owner.outbox.append(row.pk)


def duties(announcement: Announcement) -> list[OutboxMessage]:
    """The outbox messages one transition owes."""
    now = clock.now()
    checkpoint = announcement.checkpoint
    rows = []
    if announcement.run_ended and announcement.parent_step_id:
        rows.append(OutboxMessage(run_id=announcement.run_id, seq=checkpoint.seq,
                                  job=OutboxJob.PARENT, events=[], rung_at=now))
    if checkpoint.evidence.get("children"):
        rows.append(OutboxMessage(run_id=announcement.run_id, seq=checkpoint.seq,
                                  job=OutboxJob.CHILDREN, events=[], rung_at=now))
    events = (notification_events(announcement)
              if settings.TOLLGATE_NOTIFY or settings.TOLLGATE_WEBHOOKS else [])
    if settings.TOLLGATE_NOTIFY and events:
        rows.append(OutboxMessage(run_id=announcement.run_id, seq=checkpoint.seq,
                                  job=OutboxJob.NOTIFY, events=events, rung_at=now))
    gate_events = [event for event in events if event[0] in GATE_EVENTS]
    if settings.TOLLGATE_WEBHOOKS and gate_events:
        rows.append(OutboxMessage(run_id=announcement.run_id, seq=checkpoint.seq,
                                  job=OutboxJob.WEBHOOKS, events=gate_events, rung_at=now))
    if chat_providers.any_enabled() and (chat := chat_events(announcement)):
        rows.append(OutboxMessage(run_id=announcement.run_id, seq=checkpoint.seq,
                                  job=OutboxJob.CHAT, events=chat, rung_at=now))
    return rows


def deliver(message_id: int, now=None) -> str:
    """Deliver one message if it is due (claimed first: two workers never run it at once).
    Returns "done", "retrying", or "not due"."""
    now = now or clock.now()
    claimed = OutboxMessage.objects.filter(pk=message_id, done_at__isnull=True,
                                           next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    message = OutboxMessage.objects.filter(pk=message_id).first()
    if not claimed or message is None:
        return "not due"
    events = [tuple(event) for event in message.events]
    try:
        checkpoint = Checkpoint.objects.get(run_id=message.run_id, seq=message.seq)
        if message.job == OutboxJob.NOTIFY:
            notifications.deliver(checkpoint.pk, events)
            push.deliver(checkpoint.pk, events)
        elif message.job == OutboxJob.PARENT:
            engine.children.child_ended(message.run_id)
        elif message.job == OutboxJob.CHAT:
            # Each platform set up (one turned off since has nothing to update).
            for chat in chat_providers.enabled():
                chat_messages.sync(chat, message.run_id,
                                   [key for kind, key in events if kind != "remind"],
                                   reminded=[key for kind, key in events if kind == "remind"])
        elif message.job == OutboxJob.CHILDREN:
            why = ("failed" if checkpoint.step_status == StepStatus.FAILED
                   and checkpoint.kind != CheckpointKind.RUN_CANCELLED else "cancelled it")
            engine.children.cancel_children(
                message.run_id, f"Run {message.run_id} {why}: {checkpoint.summary}"[:500])
        else:
            for delivery_id in webhooks.plan(checkpoint.pk, events):
                dispatch.deliver_webhook(delivery_id)
    except Exception as exc:
        attempts = message.attempts + 1
        wait = BACKOFF_SECONDS[min(attempts, len(BACKOFF_SECONDS)) - 1]
        OutboxMessage.objects.filter(pk=message.pk).update(
            attempts=attempts, next_attempt_at=clock.now() + timedelta(seconds=wait),
            rung_at=None, last_error=f"{type(exc).__name__}: {exc}"[:2000])
        log.warning("Outbox message %s (%s) failed, attempt %s; again in %ss", message.pk,
                    message.job, attempts, wait, exc_info=True)
        return "retrying"
    OutboxMessage.objects.filter(pk=message.pk).update(done_at=clock.now(),
                                                       attempts=message.attempts + 1)
    return "done"


def due_to_ring(now=None, limit: int = 500) -> list[int]:
    """Messages due and not rung recently (a lost doorbell, or a retry come due), each
    marked rung by whoever takes it, so that consumers ticking at once ring it once."""
    now = now or clock.now()
    quiet = now - timedelta(seconds=2 * settings.TOLLGATE_SWEEP_SECONDS)
    candidates = list(OutboxMessage.objects.filter(done_at__isnull=True,
                                                   next_attempt_at__lte=now)
                      .filter(Q(rung_at__isnull=True) | Q(rung_at__lt=quiet))
                      .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    taken = []
    for pk in candidates:
        if OutboxMessage.objects.filter(pk=pk).filter(
                Q(rung_at__isnull=True) | Q(rung_at__lt=quiet)).update(rung_at=now):
            taken.append(pk)
    return taken

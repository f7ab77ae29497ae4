"""Ringing the queue. A Huey message is only a doorbell: the step row says what to do.

The dispatcher listens to the engine's `transition_committed` signal (connected in
`WorkflowsConfig.ready`), so the engine never imports the queue.
"""

from __future__ import annotations

import logging

from django.conf import settings

from .engine import Announcement
from .models import CheckpointKind, StepStatus

log = logging.getLogger(__name__)


def notification_events(announcement: Announcement) -> list[tuple[str, str]]:
    """(event, step key) pairs a committed checkpoint should tell people about."""
    checkpoint = announcement.checkpoint
    events = [("gate_waiting", key) for key in checkpoint.evidence.get("gates_opened", [])]
    step_key = checkpoint.step.key if checkpoint.step_id else ""
    if (checkpoint.kind == CheckpointKind.STEP_RETRIED
            and checkpoint.step_status == StepStatus.WAITING_APPROVAL):
        events.append(("gate_waiting", step_key))
    if checkpoint.kind in (CheckpointKind.STEP_APPROVED, CheckpointKind.STEP_REJECTED,
                           CheckpointKind.GATE_TIMED_OUT):
        events.append(("gate_decided", step_key))
    if checkpoint.kind == CheckpointKind.GATE_ESCALATED:
        events.append(("gate_escalated", step_key))
    if announcement.run_failed:
        events.append(("run_failed", step_key))
    return events


def on_transition(sender, announcement: Announcement, **kwargs) -> None:
    """After a transition commits: wake workers for its newly ready steps, schedule its
    retries, start compensation of a run that just failed, and send its notifications."""
    if settings.TOLLGATE_DISPATCH:
        wake(len(announcement.ring), announcement.priority)
        for _, eta in announcement.retry:
            wake_at(eta, announcement.priority)
        if announcement.compensations:
            compensate(announcement.run_id)
    if settings.TOLLGATE_NOTIFY or settings.TOLLGATE_WEBHOOKS:
        events = notification_events(announcement)
        if events and settings.TOLLGATE_NOTIFY:
            notify(announcement.checkpoint_id, events)
        if events and settings.TOLLGATE_WEBHOOKS:
            post_webhooks(announcement.checkpoint_id, events)


def wake(count: int, priority: int = 1) -> None:
    """Ring up to `count` doorbells (at most TOLLGATE_WAKE_LIMIT): each wakes a worker,
    which claims the next step any run has for it and keeps going while there is work, so
    a doorbell names no step. A lost one is found again by the sweeper."""
    from .tasks import work

    for _ in range(min(count, settings.TOLLGATE_WAKE_LIMIT)):
        try:
            work(priority=priority)
        except Exception:  # the queue being down must not undo a committed transition
            log.exception("Could not ring a doorbell; the sweeper will ring again")
            return


def wake_at(eta, priority: int = 1) -> None:
    """Ring a doorbell at `eta` (a scheduled retry)."""
    from .tasks import work

    try:
        work.schedule(eta=eta, priority=priority)
    except Exception:
        log.exception("Could not schedule a doorbell for %s; the sweeper will ring again", eta)


def compensate(run_id: int) -> None:
    from .tasks import compensate_run

    try:
        compensate_run(run_id)
    except Exception:
        log.exception("Could not enqueue compensation of run %s", run_id)


def post_webhooks(checkpoint_id: int, events: list[tuple[str, str]]) -> None:
    from .tasks import plan_webhooks

    try:
        plan_webhooks(checkpoint_id, events)
    except Exception:  # the periodic task posts what is due; planning waits for a retry
        log.exception("Could not enqueue webhooks for checkpoint %s", checkpoint_id)


def deliver_webhook(delivery_id: int, eta=None) -> None:
    from .tasks import deliver_webhook as task

    try:
        task.schedule(args=(delivery_id,), eta=eta) if eta else task(delivery_id)
    except Exception:
        log.exception("Could not enqueue webhook delivery %s; the periodic task will post it",
                      delivery_id)


def notify(checkpoint_id: int, events: list[tuple[str, str]]) -> None:
    from .tasks import send_notifications

    try:
        send_notifications(checkpoint_id, events)
    except Exception:
        log.exception("Could not enqueue notifications for checkpoint %s", checkpoint_id)

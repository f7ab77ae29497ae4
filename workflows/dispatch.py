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


def _enqueue(what: str, task, *args, **kwargs) -> bool:
    """Put a task on the queue. The queue being down must not undo a committed transition:
    a failure is logged, saying what is lost and who makes up for it, and returns False."""
    try:
        task(*args, **kwargs)
        return True
    except Exception:
        log.exception("Could not enqueue %s", what)
        return False


def wake(count: int, priority: int = 1) -> None:
    """Ring up to `count` doorbells (at most TOLLGATE_WAKE_LIMIT): each wakes a worker,
    which claims the next step any run has for it and keeps going while there is work, so
    a doorbell names no step. A lost one is found again by the sweeper."""
    from .tasks import work

    for _ in range(min(count, settings.TOLLGATE_WAKE_LIMIT)):
        if not _enqueue("a doorbell; the sweeper will ring again", work, priority=priority):
            return


def wake_at(eta, priority: int = 1) -> None:
    """Ring a doorbell at `eta` (a scheduled retry)."""
    from .tasks import work

    _enqueue(f"a doorbell for {eta}; the sweeper will ring again", work.schedule, eta=eta,
             priority=priority)


def compensate(run_id: int) -> None:
    from .tasks import compensate_run

    _enqueue(f"compensation of run {run_id}", compensate_run, run_id)


def post_webhooks(checkpoint_id: int, events: list[tuple[str, str]]) -> None:
    from .tasks import plan_webhooks

    _enqueue(f"webhooks for checkpoint {checkpoint_id}; they will not be posted",
             plan_webhooks, checkpoint_id, events)


def deliver_webhook(delivery_id: int, eta=None) -> None:
    from .tasks import deliver_webhook as task

    what = f"webhook delivery {delivery_id}; the periodic task will post it"
    if eta:
        _enqueue(what, task.schedule, args=(delivery_id,), eta=eta)
    else:
        _enqueue(what, task, delivery_id)


def notify(checkpoint_id: int, events: list[tuple[str, str]]) -> None:
    from .tasks import send_notifications

    _enqueue(f"notifications for checkpoint {checkpoint_id}; they will not be sent",
             send_notifications, checkpoint_id, events)

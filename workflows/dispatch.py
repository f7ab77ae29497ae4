"""Ringing the queue. A Huey message is only a doorbell: the step row says what to do.

The dispatcher listens to the engine's `transition_committed` signal (connected in
`WorkflowsConfig.ready`), so the engine never imports the queue.
"""

from __future__ import annotations

import logging

from django.conf import settings

from .engine import Announcement, mark_rung
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
    """After a transition commits: ring its newly ready steps, schedule its retries, start
    compensation of a run that just failed, and send its notifications."""
    enqueue(announcement.ring)
    for step_id, eta in announcement.retry:
        enqueue_at(step_id, eta)
    if settings.TOLLGATE_DISPATCH and announcement.run_failed:
        compensate(announcement.run_id)
    if settings.TOLLGATE_NOTIFY:
        events = notification_events(announcement)
        if events:
            notify(announcement.checkpoint_id, events)


def enqueue(step_ids) -> None:
    """Ask a worker to try each step now; a lost message is found again by the sweeper."""
    from .tasks import run_step

    for step_id in step_ids:
        try:
            run_step(step_id)
        except Exception:  # the queue being down must not undo a committed transition
            log.exception("Could not enqueue step %s; the sweeper will ring again", step_id)


def enqueue_at(step_id: int, eta) -> None:
    """Ask a worker to try a step at `eta` (a scheduled retry)."""
    from .tasks import run_step

    try:
        run_step.schedule(args=(step_id,), eta=eta)
    except Exception:
        log.exception("Could not schedule step %s; the sweeper will ring again", step_id)


def ring(step_ids) -> None:
    """Mark the steps rung and ask a worker to try each now."""
    step_ids = list(step_ids)
    mark_rung(step_ids)
    enqueue(step_ids)


def compensate(run_id: int) -> None:
    from .tasks import compensate_run

    try:
        compensate_run(run_id)
    except Exception:
        log.exception("Could not enqueue compensation of run %s", run_id)


def notify(checkpoint_id: int, events: list[tuple[str, str]]) -> None:
    from .tasks import send_notifications

    try:
        send_notifications(checkpoint_id, events)
    except Exception:
        log.exception("Could not enqueue notifications for checkpoint %s", checkpoint_id)

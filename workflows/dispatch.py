"""Ringing the queue. A Huey message is only a doorbell: the step row says what to do."""

from __future__ import annotations

import logging

from django.utils import timezone

from .models import Step

log = logging.getLogger(__name__)


def mark_rung(step_ids, retries=()) -> None:
    """Record that the queue is rung for these steps now and for each retry at its eta."""
    step_ids = list(step_ids)
    if step_ids:
        Step.objects.filter(pk__in=step_ids).update(rung_at=timezone.now())
    for step_id, eta in retries:
        Step.objects.filter(pk=step_id).update(rung_at=eta)


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

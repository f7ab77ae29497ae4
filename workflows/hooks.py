"""What follows a committed transition: ringing workers, compensation, notifications."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from .models import RunStatus


def notification_events(run, checkpoint, previous_status: str) -> list[tuple[str, str]]:
    """(event, step key) pairs this checkpoint should tell people about."""
    events = [("gate_waiting", key) for key in checkpoint.evidence.get("gates_opened", [])]
    step_key = checkpoint.step.key if checkpoint.step_id else ""
    if checkpoint.kind == "step_retried" and checkpoint.step_status == "waiting_approval":
        events.append(("gate_waiting", step_key))
    if checkpoint.kind in ("step_approved", "step_rejected", "gate_timed_out"):
        events.append(("gate_decided", step_key))
    if checkpoint.kind == "gate_escalated":
        events.append(("gate_escalated", step_key))
    if run.status == RunStatus.FAILED and previous_status != RunStatus.FAILED:
        events.append(("run_failed", step_key))
    return events


def after_transition(run, checkpoint, *, previous_status: str, ring, retry) -> None:
    """Register the follow-up work of a transition; it runs only if the transaction commits.

    `ring` are newly ready steps and `retry` (step, eta) pairs of steps to try again later.
    Each is marked rung in the transaction, so a step gets one doorbell, not one per
    transition; if the process dies before the message is sent the sweeper rings again.
    """
    from . import dispatch

    dispatch_on = settings.TOLLGATE_DISPATCH
    ring = ring if dispatch_on else []
    retry = retry if dispatch_on else []
    compensate = (dispatch_on and run.status == RunStatus.FAILED
                  and previous_status != RunStatus.FAILED)
    events = notification_events(run, checkpoint, previous_status) if (
        settings.TOLLGATE_NOTIFY) else []
    dispatch.mark_rung(ring, retry)
    run_id, checkpoint_id = run.pk, checkpoint.pk

    def follow_up() -> None:
        dispatch.enqueue(ring)
        for step_id, eta in retry:
            dispatch.enqueue_at(step_id, eta)
        if compensate:
            dispatch.compensate(run_id)
        if events:
            dispatch.notify(checkpoint_id, events)

    if ring or retry or compensate or events:
        transaction.on_commit(follow_up)

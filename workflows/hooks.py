"""What follows a committed transition: ringing workers, compensation, notifications."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from .models import RunStatus, StepKind, StepStatus


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


def after_transition(run, steps, checkpoint, *, previous_status: str) -> None:
    """Register the follow-up work of a transition; it runs only if the transaction commits."""
    from . import engine

    dispatch_on = settings.TOLLGATE_DISPATCH
    # Ring only what has not been rung yet: a doorbell per step, not one per transition.
    ready = [s.pk for s in engine.ready_steps(run, steps)
             if s.rung_at is None and s.status == StepStatus.PENDING] if dispatch_on else []
    retry = [
        (s.pk, s.retry_after) for s in steps.values()
        if dispatch_on and s.kind == StepKind.RUN and s.status == StepStatus.RETRYING
        and s.rung_at is None and s.retry_after
    ]
    compensate = (dispatch_on and run.status == RunStatus.FAILED
                  and previous_status != RunStatus.FAILED)
    events = notification_events(run, checkpoint, previous_status) if (
        settings.TOLLGATE_NOTIFY) else []
    run_id, checkpoint_id = run.pk, checkpoint.pk

    def follow_up() -> None:
        from . import dispatch

        dispatch.ring(ready)
        for step_id, eta in retry:
            dispatch.ring_at(step_id, eta)
        if compensate:
            dispatch.compensate(run_id)
        if events:
            dispatch.notify(checkpoint_id, events)

    if ready or retry or compensate or events:
        transaction.on_commit(follow_up)

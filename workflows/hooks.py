"""What follows a committed transition: ringing workers, compensation, notifications."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from .models import RunStatus, StepKind, StepStatus


def after_transition(run, steps, checkpoint, *, previous_status: str) -> None:
    """Register the follow-up work of a transition; it runs only if the transaction commits."""
    if not settings.TOLLGATE_DISPATCH:
        return
    from . import engine

    ready = [s.pk for s in engine.ready_steps(run, steps)]
    retry = [
        (s.pk, s.retry_after) for s in steps.values()
        if s.kind == StepKind.RUN and s.status == StepStatus.RETRYING and s.retry_after
        and s not in ready
    ]
    compensate = run.status == RunStatus.FAILED and previous_status != RunStatus.FAILED
    run_id = run.pk

    def ring() -> None:
        from . import dispatch

        dispatch.ring(ready)
        for step_id, eta in retry:
            dispatch.ring_at(step_id, eta)
        if compensate:
            dispatch.compensate(run_id)

    if ready or retry or compensate:
        transaction.on_commit(ring)

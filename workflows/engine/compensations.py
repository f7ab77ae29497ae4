"""Compensation as durable work: planned in the transaction that fails a run, claimed under a
lease one at a time (latest completed step first), recorded with a checkpoint.

A compensation whose worker died is released back to pending by the sweeper and runs again,
so compensations must be safe to repeat.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction

from workflows.engine.commit import commit
from workflows.engine.moves import set_holder
from workflows.engine.rows import locked
from workflows.models import (
    Checkpoint,
    CheckpointKind,
    Compensation,
    CompensationStatus,
    Run,
    StepStatus,
)
from workflows.timing import clock

OPEN = (CompensationStatus.PENDING, CompensationStatus.RUNNING)


def under_way(run: Run) -> bool:
    return Compensation.objects.filter(run=run, status__in=OPEN).exists()


def claim(run_id: int, *, owner: str, lease_seconds: float, holder=None):
    """The run's next compensation, now running under a lease; None if there is none to
    start (all done, or one is running: they run one at a time, in order)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return None
        open_rows = Compensation.objects.filter(run=run, status__in=OPEN).order_by("order")
        row = open_rows.select_related("step").first()
        if row is None or row.status == CompensationStatus.RUNNING:
            return None
        now = clock.now()
        row.status, row.attempt = CompensationStatus.RUNNING, row.attempt + 1
        row.lease_token = uuid.uuid4().hex
        row.lease_expires_at = now + timedelta(seconds=lease_seconds)
        if holder is not None:
            set_holder(row, holder)
        row.save()
        row.run = run
        return row


def renew(row_id: int, token: str, seconds: float) -> bool:
    return bool(Compensation.objects.filter(pk=row_id, lease_token=token,
                                            status=CompensationStatus.RUNNING)
                .update(lease_expires_at=clock.now() + timedelta(seconds=seconds)))


def finish(row_id: int, token: str, *, ok: bool, summary: str = "",
           evidence=None) -> Checkpoint | None:
    """Record a compensation's outcome: the step is `compensated` (not done any more) or the
    failure is on the timeline. A report whose lease was lost records nothing."""
    found = Compensation.objects.filter(pk=row_id).values_list("run_id", "step_id").first()
    if found is None:
        return None
    run_id, step_id = found
    with locked(run_id, step_id=step_id) as state:
        row = Compensation.objects.get(pk=row_id)
        if row.status != CompensationStatus.RUNNING or row.lease_token != token:
            return None  # released by the sweeper meanwhile; another attempt owns it
        now = clock.now()
        row.status = CompensationStatus.DONE if ok else CompensationStatus.FAILED
        row.summary, row.finished_at, row.lease_token = summary[:10000], now, ""
        row.lease_expires_at = None
        row.save()
        step = state.find(step_id)
        if ok:
            step.status = StepStatus.COMPENSATED
        kind = CheckpointKind.COMPENSATED if ok else CheckpointKind.COMPENSATION_FAILED
        return commit(state, kind, actor=None, step=step,
                      evidence={**(evidence or {}), "attempt": row.attempt},
                      summary=f"Compensation of {step.title}: {summary}")


def release(row_id: int, token: str = "") -> Checkpoint | None:
    """The sweeper's move: a compensation whose worker is gone goes back to pending, to run
    again; its lease must have run out, unless `token` names the attempt that was cut short
    (its result says so)."""
    row = Compensation.objects.filter(pk=row_id).select_related("step").first()
    if row is None:
        return None
    with locked(row.run_id) as state:
        held = {"lease_token": token} if token else {"lease_expires_at__lt": clock.now()}
        released = Compensation.objects.filter(
            pk=row_id, status=CompensationStatus.RUNNING, **held).update(
            status=CompensationStatus.PENDING, lease_token="", lease_expires_at=None,
            rung_at=None)
        if not released:
            return None
        return commit(state, CheckpointKind.LEASE_RECOVERED, actor="sweeper",
                      summary=f"Compensation of {row.step.title}: its worker is gone "
                              f"(attempt {row.attempt}); it will run again",
                      evidence={"compensation": row.pk, "holder": {
                          "host": row.holder_host, "pid": row.holder_pid}})

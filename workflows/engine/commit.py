"""The commit: every transition ends here, in the transaction that holds the run's lock.

It saves the acted step, opens gates whose dependencies settled, derives the run's status and
next action from the frontier, appends exactly one checkpoint, and announces what follows
(steps to ring, retries, compensation, notifications) for after the transaction commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from ..models import Checkpoint, Compensation, Run, RunStatus, Step, StepKind, StepStatus
from .moves import close_gate, open_gate, start_waiting
from .rows import (
    RUN_COLUMNS,
    actor_of,
    first_ready,
    read_frontier,
    save_step,
    tell_dependents,
)
from .rules import SETTLED, hard_failure, next_action, run_status

# Sent once the transaction of a transition has committed, with `announcement`. The
# dispatcher listens (it rings the queue); the engine imports nothing above it.
transition_committed = Signal()


@dataclass
class Announcement:
    """What a committed transition asks the rest of the system to do."""

    run_id: int
    checkpoint_id: int
    checkpoint: Checkpoint
    run_status: str
    previous_status: str
    ring: list[int] = field(default_factory=list)  # newly ready steps
    retry: list[tuple[int, object]] = field(default_factory=list)  # (step id, eta)

    @property
    def run_failed(self) -> bool:
        return self.run_status == RunStatus.FAILED and self.previous_status != RunStatus.FAILED


def commit(run: Run, kind: str, *, actor, step: Step | None = None, summary: str = "",
           evidence: dict | None = None, state_patch: dict | None = None) -> Checkpoint:
    """Save the acted step, settle what follows from it and append the one checkpoint."""
    now = timezone.now()
    frontier = _save_acted(run, step)
    failed = hard_failure(frontier)
    opened = _open_gates(run, frontier, failed, now)
    previous_status = run.status
    reopened = _settle_run(run, frontier, step, now, previous_status)
    for gate in (*opened, *reopened):
        save_step(gate) if isinstance(gate, Step) else gate.save()
    run.checkpoint_seq += 1
    run.save(update_fields=RUN_COLUMNS)
    gates = [gate.key for gate in opened if gate.kind == StepKind.APPROVAL]
    if gates:
        evidence = {**(evidence or {}), "gates_opened": gates}
    checkpoint = _append_checkpoint(run, kind, actor, step, summary, evidence, state_patch, now)
    _announce(run, checkpoint, frontier, failed, previous_status)
    return checkpoint


def _save_acted(run: Run, step: Step | None) -> list:
    """Write the acted step, then read the frontier it leaves (with the step itself in it)."""
    if step is not None:
        save_step(step)
        tell_dependents(run, step)
    return [step if step is not None and row.key == step.key else row
            for row in read_frontier(run)]


def _open_gates(run: Run, frontier, failed, now) -> list:
    """Gates whose dependencies have settled start waiting on their approvers; wait steps
    start waiting for their report (and their timeout)."""
    if run.status == RunStatus.CANCELLED or failed:
        return []
    opened = [gate for gate in frontier
              if gate.kind == StepKind.APPROVAL and gate.status == StepStatus.PENDING]
    for gate in opened:
        open_gate(gate, now)
    for step in frontier:
        if (step.kind == StepKind.WAIT and step.status == StepStatus.PENDING
                and step.waiting_on == 0 and step.waiting_since is None):
            start_waiting(step, now)
            opened.append(step)
    return opened


def _settle_run(run: Run, frontier, step: Step | None, now, previous_status: str) -> list:
    """Derive the run's status, times and next action; returns gates a failure closed.
    A run that fails here owes the compensations of its completed steps."""
    busy = any(s.status != StepStatus.PENDING for s in frontier)
    # The ready step to name: the first not yet rung, else (ready steps already rung are
    # not in the frontier) the first one at all, looked up when nothing else is open.
    ready = next((s for s in frontier
                  if s.kind == StepKind.RUN and s.status == StepStatus.PENDING), None)
    if ready is None and not busy:
        ready = first_ready(run)
    unsettled = busy or ready is not None or Step.objects.filter(run=run).exclude(
        SETTLED).exists()
    moved = run.started_at is not None or (step is not None and (
        step.attempt > 0 or step.status == StepStatus.SKIPPED))
    run.status = run_status(run, frontier, unsettled=unsettled, moved=moved)
    reopened = []
    if run.status == RunStatus.FAILED:
        # A failed run waits on nobody: its open gates go back to pending until a retry.
        for gate in frontier:
            if gate.status == StepStatus.WAITING_APPROVAL:
                gate.status = StepStatus.PENDING
                gate.waiting_since = None
                close_gate(gate)
                reopened.append(gate)
    if run.status == RunStatus.FAILED and previous_status != RunStatus.FAILED:
        _plan_compensations(run, now)
    if run.is_terminal:
        run.finished_at = run.finished_at or now
    else:
        run.finished_at = None
        run.error = ""
    if run.started_at is None and run.status != RunStatus.OPEN:
        run.started_at = now
    run.current_step, run.next_action = next_action(frontier, ready)
    return reopened


def _plan_compensations(run: Run, now) -> int:
    """Rows for the compensations a run that just failed owes (in its transaction)."""
    steps = list(Step.objects.filter(run=run, status=StepStatus.COMPLETED,
                                     compensation__isnull=False, compensated_at__isnull=True)
                 .order_by("-finished_at", "-index").values_list("pk", flat=True))
    if not steps:
        return 0
    first = (Compensation.objects.filter(run=run).order_by("-order")
             .values_list("order", flat=True).first() or 0) + 1
    Compensation.objects.bulk_create(
        Compensation(run=run, step_id=step_id, order=first + i, created_at=now)
        for i, step_id in enumerate(steps))
    Step.objects.filter(pk__in=steps).update(compensated_at=now)  # planned: never twice
    return len(steps)


def _append_checkpoint(run, kind, actor, step, summary, evidence, state_patch, now):
    user, name = actor_of(actor)
    return Checkpoint.objects.create(
        run=run, seq=run.checkpoint_seq, kind=kind, step=step, run_status=run.status,
        step_status=step.status if step else "", actor=user, actor_name=name,
        summary=summary[:10000], evidence=evidence or {}, state_patch=state_patch or {}, at=now)


def _announce(run: Run, checkpoint: Checkpoint, frontier, failed, previous_status: str) -> None:
    """Mark newly ready steps rung (one doorbell each, in this transaction) and announce the
    transition once it commits. If the process dies before the doorbell goes out, the
    sweeper rings again."""
    announcement = Announcement(run.pk, checkpoint.pk, checkpoint, run.status, previous_status)
    if settings.TOLLGATE_DISPATCH:
        if not (run.is_terminal or failed):
            announcement.ring = [s.pk for s in frontier if s.kind == StepKind.RUN
                                 and s.status == StepStatus.PENDING and s.rung_at is None]
        announcement.retry = [(s.pk, s.retry_after) for s in frontier
                              if s.status == StepStatus.RETRYING and s.rung_at is None
                              and s.retry_after]
        mark_rung(announcement.ring, announcement.retry)
    # Kept on the checkpoint until the commit: a chained claim takes its step out of `ring`.
    checkpoint.announcement = announcement
    transaction.on_commit(
        lambda: transition_committed.send(sender=Run, announcement=announcement))


def mark_rung(step_ids, retries=()) -> None:
    """Record that the queue is rung for these steps now and for each retry at its eta."""
    step_ids = list(step_ids)
    if step_ids:
        Step.objects.filter(pk__in=step_ids).update(rung_at=timezone.now())
    for step_id, eta in retries:
        Step.objects.filter(pk=step_id).update(rung_at=eta)

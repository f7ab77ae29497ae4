"""The sweeper: finds what crashed workers and lost messages left behind.

An expired lease is reclaimed only once its holder is gone. On this machine that is checked
(the holder's boot id, pid and start time); a holder on another machine cannot be checked, so
its lease is reclaimed only after the lease plus the kill grace, by which time a worker that
could not renew has killed its own command (it fences itself). Each row is handled on its own:
one that fails is logged, noted on its run once, and skipped; the others go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from workflows import engine
from workflows.delivery import dispatch
from workflows.engine import processes
from workflows.models import (
    Checkpoint,
    CheckpointKind,
    Compensation,
    CompensationStatus,
    Run,
    RunStatus,
    Step,
    StepStatus,
    Worker,
)
from workflows.timing import clock
from workflows.workers import worker

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    expired: int = 0
    overdue: int = 0
    rerung: int = 0
    compensations: int = 0
    failed: int = 0
    recorded: int = 0
    released: int = 0


HOLDER_FIELDS = ("pk", "run_id", "lease_token", "lease_expires_at", "holder_host",
                 "holder_boot_id", "holder_pidns", "holder_pid", "holder_started",
                 "overdue_noted_at", "began_at", "lease_owner")


LET_GO = "let go"  # the holder lives, but has said it no longer holds the lease


def let_go(row: dict) -> bool:
    """Has the lease's holder, alive, reported since the lease ran out (its presence beat,
    which lists every lease it keeps) without this one? Then it let go of it (its database
    was away longer than the lease) and will never record it: the lease is free to take
    back. A frozen or cut-off holder reports nothing, so it is waited for as before."""
    seen = (Worker.objects.filter(host=row["holder_host"], boot_id=row["holder_boot_id"],
                                  pidns=row["holder_pidns"], pid=row["holder_pid"],
                                  started=row["holder_started"])
            .values_list("last_seen", "holds").first())
    return (seen is not None and seen[0] > row["lease_expires_at"]
            and f"step:{row['pk']}" not in (seen[1] or []))


# A claim whose lease ran out before its work began: the record says so, whoever held it.
NEVER_BEGAN = ("Claimed in a batch; its lease ran out before its turn came (its worker was "
               "lost, cut off or let go of it): given back, no attempt spent")
LET_GO_WHY = ("Lease of {owner} let go by its worker, which lives: its database was away "
              "longer than the lease, so it stopped the command it had begun")


def expired_leases(now, limit: int) -> list[dict]:
    """Running steps whose lease ran out; served by the partial index on live leases."""
    return list(Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__lt=now)
                .order_by("lease_expires_at").values(*HOLDER_FIELDS)[:limit])


def holder_gone(row: dict, now) -> tuple[bool, str]:
    """(may the lease be reclaimed now, what the holder's state is)."""
    state = processes.holder_state(row["holder_host"], row["holder_boot_id"], row["holder_pid"],
                                   row["holder_started"], row["holder_pidns"])
    if state != processes.GONE and let_go(row):
        return True, LET_GO
    if state == processes.UNKNOWN:
        grace = timedelta(seconds=settings.TOLLGATE_KILL_GRACE_SECONDS)
        return row["lease_expires_at"] + grace < now, state
    return state == processes.GONE, state


def sweep(now=None, limit: int = 1000) -> SweepReport:
    """Reclaim dead leases (retry or fail, with a checkpoint), note overdue live ones,
    recover compensations and re-ring idle ready steps. Leases are judged by the
    database's own clock, never this process's."""
    now = now or clock.database_now()
    report = SweepReport()
    # A dead consumer's finished results on this machine are recorded before its leases
    # are judged: a finished command is never run again.
    try:
        report.recorded = worker.record_orphans(force=True)
    except Exception:
        log.exception("Could not record the spool's orphaned results")
    gone_by_run: dict[int, list[int]] = {}
    unstarted: list[dict] = []
    let_go_rows: list[dict] = []
    for row in expired_leases(now, limit):
        try:
            if row["began_at"] is None:  # never begun: nothing of it can run or be lost
                unstarted.append(row)
                continue
            gone, state = holder_gone(row, now)
            if gone and worker.record_finished("step", row["pk"], row["lease_token"]):
                report.recorded += 1
            elif gone and state == LET_GO:
                let_go_rows.append(row)
            elif gone:
                gone_by_run.setdefault(row["run_id"], []).append(row["pk"])
            elif state == processes.ALIVE and row["overdue_noted_at"] is None:
                report.overdue += bool(engine.note_lease_overdue(row["pk"]))
        except Exception as exc:  # one bad row must not stop the sweep for everyone
            report.failed += 1
            note_failure(row["run_id"], row["pk"], "reclaim its lease", exc)
    if unstarted:
        try:
            report.released = len(engine.release_unstarted(
                {row["pk"]: row["lease_token"] for row in unstarted}, actor="sweeper",
                why=NEVER_BEGAN, unless_began=True))
        except Exception:  # the next sweep tries again; none of them can begin meanwhile
            log.exception("Could not give back %d unstarted step(s)", len(unstarted))
    for row in let_go_rows:
        try:
            why = LET_GO_WHY.format(owner=row["lease_owner"] or "its worker")
            report.expired += bool(engine.expire_lease(row["pk"], why=why))
        except Exception as exc:
            report.failed += 1
            note_failure(row["run_id"], row["pk"], "reclaim its lease", exc)
    runs = sorted(gone_by_run)
    for start in range(0, len(runs), RUNS_PER_BATCH):
        batch = {run_id: gone_by_run[run_id] for run_id in runs[start:start + RUNS_PER_BATCH]}
        report.expired += expire(batch, report)
    report.compensations = recover_compensations(now, limit)
    report.rerung = rering_idle(now, limit)
    return report


# Dead leases are reclaimed this many runs to a transaction: one commit for all of them.
RUNS_PER_BATCH = 50


def expire(leases: dict[int, list[int]], report: SweepReport) -> int:
    """Reclaim a batch of dead leases ({run id: step ids}) in one transaction; if that fails,
    one at a time, so that one bad row holds back no other."""
    try:
        return len(engine.expire_leases(leases))
    except Exception:
        log.warning("Could not reclaim %s runs' leases together; one at a time", len(leases),
                    exc_info=True)
    expired = 0
    for run_id, step_ids in leases.items():
        for step_id in step_ids:
            try:
                expired += bool(engine.expire_lease(step_id))
            except Exception as exc:
                report.failed += 1
                note_failure(run_id, step_id, "reclaim its lease", exc)
    return expired


def note_failure(run_id: int, step_id: int | None, what: str, exc: Exception) -> None:
    """Log a row the sweeper could not handle, and say so once on its run's timeline."""
    log.exception("Sweeper could not %s (run %s, step %s)", what, run_id, step_id)
    try:
        if not Checkpoint.objects.filter(run_id=run_id, step_id=step_id,
                                         kind=CheckpointKind.SWEEP_FAILED).exists():
            engine.note_sweep_failure(run_id, step_id, f"The sweeper could not {what}: "
                                                       f"{type(exc).__name__}: {exc}")
    except Exception:
        log.exception("Could not note the sweeper's failure on run %s", run_id)


def recover_compensations(now, limit: int) -> int:
    """Compensations whose worker died go back to pending; pending ones whose doorbell looks
    lost are rung again."""
    quiet = now - timedelta(seconds=2 * settings.TOLLGATE_SWEEP_SECONDS)
    count = 0
    expired = (Compensation.objects.filter(status=CompensationStatus.RUNNING,
                                           lease_expires_at__lt=now)
               .values("pk", "run_id", "lease_token", "lease_expires_at", "holder_host",
                       "holder_boot_id", "holder_pidns", "holder_pid", "holder_started")[:limit])
    for row in expired:
        try:
            if not holder_gone(row, now)[0]:
                continue
            if worker.record_finished("compensation", row["pk"], row["lease_token"]):
                count += 1  # it finished: recorded from the spool, not run again
            elif engine.release_compensation(row["pk"]):
                count += 1
        except Exception as exc:
            note_failure(row["run_id"], None, "recover a compensation", exc)
    idle = (Compensation.objects.filter(status=CompensationStatus.PENDING)
            .filter(Q(rung_at__isnull=True) | Q(rung_at__lt=quiet))
            .values_list("run_id", flat=True).distinct()[:limit])
    for run_id in list(idle):
        # Marked rung by whoever takes it: consumers sweeping at once ring it once.
        taken = (Compensation.objects.filter(run_id=run_id, status=CompensationStatus.PENDING)
                 .filter(Q(rung_at__isnull=True) | Q(rung_at__lt=quiet)).update(rung_at=now))
        if taken:
            dispatch.compensate(run_id)
            count += 1
    return count


def rering_idle(now, limit: int) -> int:
    """Wake workers for runs that have had work for a while that no worker served: their
    doorbells look lost. A run with a ready step but no claim time gets it back first."""
    quiet = now - timedelta(seconds=2 * settings.TOLLGATE_SWEEP_SECONDS)
    has_ready = Q()
    for ready in engine.ready_filters(now):
        has_ready |= Exists(Step.objects.filter(ready, run=OuterRef("pk")))
    unscheduled = (Run.objects.filter(status__in=[RunStatus.OPEN, RunStatus.RUNNING],
                                      claimable_at__isnull=True, updated_at__lt=quiet)
                   .filter(has_ready)
                   .exclude(Exists(Step.objects.filter(run=OuterRef("pk"),
                                                       status=StepStatus.FAILED,
                                                       continue_on_failure=False)))
                   .order_by().values_list("pk", flat=True)[:limit])
    for run_id in list(unscheduled):
        try:
            engine.reschedule(run_id)
        except Exception as exc:
            note_failure(run_id, None, "reschedule its ready steps", exc)
    idle = list(Run.objects.filter(claimable_at__lte=quiet, served_at__lt=quiet)
                .order_by("-priority_rank", "served_at")
                .values_list("priority_rank", flat=True)[:limit])
    for rank in idle:
        dispatch.wake(1, rank)
    return len(idle)

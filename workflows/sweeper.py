"""The sweeper: finds what crashed workers and lost messages left behind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import dispatch, engine
from .models import Run, RunStatus, Step, StepStatus


@dataclass
class SweepReport:
    expired: int = 0
    rerung: int = 0


def expired_lease_ids(now, limit: int) -> list[int]:
    """Running steps whose lease ran out; served by the partial index on live leases."""
    return list(
        Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:limit]
    )


def sweep(now=None, limit: int = 1000) -> SweepReport:
    """Expire dead leases (retry or fail, with a checkpoint) and re-ring idle ready steps."""
    now = now or timezone.now()
    report = SweepReport()
    for step_id in expired_lease_ids(now, limit):
        if engine.expire_lease(step_id):
            report.expired += 1
    report.rerung = rering_idle(now, limit)
    return report


def rering_idle(now, limit: int) -> int:
    """Ring ready steps of runs that have not moved lately and whose doorbell looks lost."""
    quiet = now - timedelta(seconds=2 * settings.TOLLGATE_SWEEP_SECONDS)
    runs = (Run.objects.filter(status__in=[RunStatus.OPEN, RunStatus.RUNNING],
                               updated_at__lt=quiet)
            .order_by("updated_at").values_list("pk", flat=True)[:limit])
    run_ids = list(runs)
    if not run_ids:
        return 0
    by_run: dict[int, dict[str, Step]] = {}
    for step in Step.objects.filter(run_id__in=run_ids).order_by("run_id", "index"):
        by_run.setdefault(step.run_id, {})[step.key] = step
    run_map = Run.objects.in_bulk(run_ids)
    ring = []
    for run_id, steps in by_run.items():
        for step in engine.ready_steps(run_map[run_id], steps, now):
            if step.rung_at is None or step.rung_at < quiet:
                ring.append(step.pk)
    dispatch.ring(ring)
    return len(ring)

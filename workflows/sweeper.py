"""The sweeper: finds what crashed workers and lost messages left behind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
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
    idle_runs = (Run.objects.filter(status__in=[RunStatus.OPEN, RunStatus.RUNNING],
                                    updated_at__lt=quiet)
                 .order_by("updated_at").values_list("pk", flat=True)[:limit])
    ready = (Step.objects.filter(engine.ready_filter(now), run__in=list(idle_runs))
             .filter(Q(rung_at__isnull=True) | Q(rung_at__lt=quiet))
             .exclude(engine.RUN_HAS_HARD_FAILURE))
    ring = list(ready.values_list("pk", flat=True)[:limit])
    dispatch.ring(ring)
    return len(ring)

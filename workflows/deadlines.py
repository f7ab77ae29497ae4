"""Deadlines: gates past theirs are rejected or escalated, wait steps fail or are skipped."""

from __future__ import annotations

from django.utils import timezone

from . import engine
from .models import Step, StepKind, StepStatus


def apply(now=None, limit: int = 1000) -> int:
    """Expire every overdue gate; served by the partial index on waiting gates' deadlines."""
    now = now or timezone.now()
    overdue = (Step.objects.filter(status=StepStatus.WAITING_APPROVAL, deadline_at__lte=now)
               .order_by("deadline_at").values_list("pk", flat=True)[:limit])
    gates = sum(1 for step_id in list(overdue) if engine.expire_gate(step_id))
    waits = (Step.objects.filter(kind=StepKind.WAIT, deadline_at__lte=now)
             .order_by("deadline_at").values_list("pk", flat=True)[:limit])
    return gates + sum(1 for step_id in list(waits) if engine.expire_wait(step_id))

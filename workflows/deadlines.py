"""Approval deadlines: gates past their deadline are rejected or escalated by the engine."""

from __future__ import annotations

from django.utils import timezone

from . import engine
from .models import Step, StepStatus


def apply(now=None, limit: int = 1000) -> int:
    """Expire every overdue gate; served by the partial index on waiting gates' deadlines."""
    now = now or timezone.now()
    overdue = (Step.objects.filter(status=StepStatus.WAITING_APPROVAL, deadline_at__lte=now)
               .order_by("deadline_at").values_list("pk", flat=True)[:limit])
    return sum(1 for step_id in list(overdue) if engine.expire_gate(step_id))

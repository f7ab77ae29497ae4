"""Read-side queries shared by pages, the API and commands."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet

from .models import OPEN_RUN_STATUSES, Approval, Step, StepStatus


def waiting_gates_for(user) -> QuerySet[Step]:
    """Gates this user may decide now: their group, not yet decided by them, not self-barred."""
    groups = user.groups.values("name")  # a subquery, not a round trip
    decided = Approval.objects.filter(step=OuterRef("pk"), attempt=OuterRef("attempt"),
                                      user=user)
    return (
        Step.objects.filter(status=StepStatus.WAITING_APPROVAL, approval_group__in=groups,
                            run__status__in=OPEN_RUN_STATUSES)
        .exclude(Q(run__requested_by=user) & Q(allow_self_approval=False))
        .exclude(Exists(decided))
        .order_by("waiting_since", "pk")
    )


def inbox_count(user) -> int:
    return waiting_gates_for(user).count()

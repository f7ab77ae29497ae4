"""Who may press which button; the engine checks the approval rules again on every press."""

from __future__ import annotations

from .models import OPEN_RUN_STATUSES, StepStatus


def is_person(actor) -> bool:
    """An actor that is a user account, as opposed to the system (None or a name)."""
    return actor is not None and not isinstance(actor, str)


def can_operate(user) -> bool:
    """Retry, skip and cancel need the operator permission."""
    return user.is_authenticated and user.has_perm("workflows.operate_run")


def group_names(user) -> set[str]:
    if not hasattr(user, "_tollgate_groups"):
        user._tollgate_groups = set(user.groups.values_list("name", flat=True))
    return user._tollgate_groups


def can_decide(user, run, step, decided_step_ids: set[int]) -> bool:
    """True when this user may approve or reject this gate now."""
    return (
        user.is_authenticated
        and step.status == StepStatus.WAITING_APPROVAL
        and run.status in OPEN_RUN_STATUSES
        and step.approval_group in group_names(user)
        and (run.requested_by_id != user.pk or step.allow_self_approval)
        and step.pk not in decided_step_ids
    )


def can_retry(user, run, step) -> bool:
    return step.status == StepStatus.FAILED and run.status != "cancelled" and can_operate(user)


def can_cancel(user, run) -> bool:
    return run.status in OPEN_RUN_STATUSES and can_operate(user)

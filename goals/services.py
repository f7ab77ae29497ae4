"""Goal changes that keep the hierarchy's rules, whoever makes them."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from .models import Goal, GoalStatus

EDITABLE_FIELDS = {
    "title", "objective", "parent", "status", "priority", "owner", "next_action",
    "success_signal", "blocker_reason", "shared_state",
}


def require_goal_permission(actor, action: str) -> None:
    """A person needs goals.add_goal or goals.change_goal; the system (None) may act."""
    if actor is not None and not actor.has_perm(f"goals.{action}_goal"):
        raise PermissionDenied(f"{actor.get_username() or 'anonymous'} may not {action} goals.")


def goal_save(goal: Goal, *, actor=None) -> Goal:
    """Validate (cycles, blocker) and save; raises ValidationError and changes nothing."""
    require_goal_permission(actor, "add" if goal._state.adding else "change")
    goal.full_clean()
    goal.save()
    return goal


def goal_update(goal: Goal, *, actor=None, **fields) -> Goal:
    """Apply field changes under a row lock, then validate and save."""
    require_goal_permission(actor, "change")
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise ValidationError(f"Unknown goal field(s): {', '.join(sorted(unknown))}.")
    with transaction.atomic():
        locked = Goal.objects.select_for_update().get(pk=goal.pk)
        for name, value in fields.items():
            setattr(locked, name, value)
        return goal_save(locked, actor=actor)


def goal_set_status(goal: Goal, status: str, *, actor=None, blocker_reason: str = "") -> Goal:
    """Move a goal to `status`; closing stamps closed_at, reopening clears it."""
    if status not in GoalStatus.values:
        raise ValidationError(f"Unknown goal status {status!r}.")
    return goal_update(goal, actor=actor, status=status, blocker_reason=blocker_reason)

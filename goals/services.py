"""Goal changes that keep the hierarchy's rules, whoever makes them."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.dispatch import Signal

from . import tree
from .models import Goal, GoalStatus

EDITABLE_FIELDS = {
    "title", "objective", "parent", "status", "priority", "owner", "next_action",
    "success_signal", "blocker_reason", "shared_state",
}


# Sent inside the transaction that closes a goal, with `goal`, `actor` and `open_runs`
# ("refuse" or "cancel"). The workflows app answers (goals sit below it and import nothing
# of it): it refuses with OpenRuns while runs under the goal are open, or cancels them.
goal_closing = Signal()
OPEN_RUN_POLICIES = ("refuse", "cancel")


class OpenRuns(ValidationError):
    """The goal has open runs: closing it needs them cancelled (or the goal kept open)."""

    def __init__(self, goal: Goal, run_ids: list[int]):
        self.goal, self.run_ids = goal, run_ids
        shown = ", ".join(f"#{pk}" for pk in run_ids[:10]) + (" …" if len(run_ids) > 10 else "")
        super().__init__(f"Goal {goal.pk} ({goal.title}) has {len(run_ids)} open run"
                         f"{'s' if len(run_ids) != 1 else ''} ({shown}): cancel them to close "
                         "it, or keep the goal open.")


def require_goal_permission(actor, action: str) -> None:
    """A person needs goals.add_goal or goals.change_goal; the system (None) may act."""
    if actor is not None and not actor.has_perm(f"goals.{action}_goal"):
        raise PermissionDenied(f"{actor.get_username() or 'anonymous'} may not {action} goals.")


def goal_save(goal: Goal, *, actor=None) -> Goal:
    """Validate (cycles, blocker) and save; raises ValidationError and changes nothing."""
    require_goal_permission(actor, "add" if goal._state.adding else "change")
    if goal._state.adding and actor is not None:
        goal.opened_by = actor
    with transaction.atomic():
        # Goal saves take turns (PostgreSQL): the cycle check and the closure's update see
        # one shape of the tree, whatever other goals move at the same time.
        tree.lock()
        goal.full_clean()
        goal.save()
    return goal


def goal_update(goal: Goal, *, actor=None, open_runs: str = "refuse", **fields) -> Goal:
    """Apply field changes under a row lock, then validate and save. Closing a goal with
    open runs under it is refused (OpenRuns) unless `open_runs` is "cancel": then they are
    cancelled, each through the engine, in the same transaction."""
    require_goal_permission(actor, "change")
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise ValidationError(f"Unknown goal field(s): {', '.join(sorted(unknown))}.")
    if open_runs not in OPEN_RUN_POLICIES:
        raise ValidationError(f"open_runs must be refuse or cancel, got {open_runs!r}.")
    with transaction.atomic():
        # NO KEY: a move elsewhere may still link goals under this one while it waits.
        locked = Goal.objects.select_for_update(no_key=True).get(pk=goal.pk)
        was_closed = locked.is_closed
        for name, value in fields.items():
            setattr(locked, name, value)
        if locked.is_closed and not was_closed:
            goal_closing.send(sender=Goal, goal=locked, actor=actor, open_runs=open_runs)
        return goal_save(locked, actor=actor)


def goal_set_status(goal: Goal, status: str, *, actor=None, blocker_reason: str = "",
                    open_runs: str = "refuse") -> Goal:
    """Move a goal to `status`; closing stamps closed_at, reopening clears it."""
    if status not in GoalStatus.values:
        raise ValidationError(f"Unknown goal status {status!r}.")
    return goal_update(goal, actor=actor, status=status, blocker_reason=blocker_reason,
                       open_runs=open_runs)

"""The workflows side of closing a goal: its open runs are refused or cancelled (goals
sends `goal_closing`; this module answers, so that goals imports nothing of workflows)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.dispatch import receiver

from goals.models import Goal
from goals.services import OpenRuns, goal_closing
from workflows import engine
from workflows.models import OPEN_RUN_STATUSES, Run


@receiver(goal_closing, sender=Goal, dispatch_uid="tollgate-goal-closing")
def on_goal_closing(sender, goal: Goal, actor, open_runs: str, **kwargs) -> None:
    run_ids = list(Run.objects.filter(goal=goal, status__in=OPEN_RUN_STATUSES)
                   .order_by("pk").values_list("pk", flat=True))
    if not run_ids:
        return
    if open_runs != "cancel":
        raise OpenRuns(goal, run_ids)
    for run_id in run_ids:
        try:
            engine.cancel_run(run_id, actor=actor,
                              reason=f"Goal {goal.pk} ({goal.title}) was closed")
        except engine.NotPermitted as exc:
            raise PermissionDenied(str(exc)) from None

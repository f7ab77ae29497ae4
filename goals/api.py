"""The goals API: the hierarchy with subtree rollups; changes go through the goal services."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Coalesce, Greatest
from django.http import Http404
from ninja import Field, Query, Router, Schema, Status
from ninja.errors import HttpError
from pydantic import ConfigDict

from tollgate.query import MAX_ID
from tollgate.schemas import SAYS_SOMETHING, Error, Id, Input, WholeId

from .models import CLOSED_GOAL_STATUSES, Goal, GoalStatus, Priority
from .rollup import rollups
from .services import goal_save, goal_update

router = Router(tags=["goals"])


class RollupOut(Schema):
    child_goals: int
    descendant_goals: int
    runs_open: int
    runs_completed: int
    runs_failed: int
    gates_waiting: int
    steps_total: int
    steps_done: int
    percent_done: int
    oldest_gate_since: datetime | None


class GoalOut(Schema):
    id: int
    title: str
    objective: str
    parent: int | None
    status: str
    priority: str
    owner: str | None
    opened_by: str | None
    next_action: str
    success_signal: str
    blocker_reason: str
    shared_state: dict[str, Any]
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    rollup: RollupOut


GoalStatusName = Literal[tuple(GoalStatus.values)]
PriorityName = Literal[tuple(Priority.values)]


# A goal set blocked says why.
BLOCKED_SAYS_WHY = ConfigDict(json_schema_extra={
    "if": {"required": ["status"], "properties": {"status": {"const": "blocked"}}},
    "then": {"required": ["blocker_reason"],
             "properties": {"blocker_reason": {"type": "string", **SAYS_SOMETHING}}}})


class GoalIn(Input):
    model_config = BLOCKED_SAYS_WHY

    title: str = Field(min_length=1, max_length=200)
    objective: str = Field("", max_length=5000)
    parent: WholeId | None = None
    status: GoalStatusName = "active"
    priority: PriorityName = "normal"
    owner: str | None = Field(None, min_length=1, max_length=150, description="username")
    next_action: str = Field("", max_length=500)
    success_signal: str = Field("", max_length=500)
    blocker_reason: str = Field("", max_length=500)
    shared_state: dict[str, Any] = {}


class GoalPatch(Input):
    """Only the fields sent change; `parent` and `owner` may be null (a root goal, no owner),
    the others may not."""

    model_config = BLOCKED_SAYS_WHY

    title: str = Field(None, min_length=1, max_length=200)
    objective: str = Field(None, max_length=5000)
    parent: WholeId | None = None
    status: GoalStatusName = None
    priority: PriorityName = None
    owner: str | None = Field(None, min_length=1, max_length=150)
    next_action: str = Field(None, max_length=500)
    success_signal: str = Field(None, max_length=500)
    blocker_reason: str = Field(None, max_length=500)
    shared_state: dict[str, Any] = None


def goal_out(goal: Goal, rollup) -> dict:
    return {**{f: getattr(goal, f) for f in (
        "id", "title", "objective", "status", "priority", "next_action", "success_signal",
        "blocker_reason", "shared_state", "opened_at", "updated_at", "closed_at")},
        "parent": goal.parent_id, "owner": goal.owner.get_username() if goal.owner else None,
        "opened_by": goal.opened_by.get_username() if goal.opened_by else None,
        "rollup": rollup.as_dict()}



def _owner(username: str | None):
    if username is None:
        return None
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise HttpError(400, f"owner: no user named {username!r}.")
    return user


def _parent(pk: int | None) -> Goal | None:
    if pk is None:
        return None
    parent = Goal.objects.filter(pk=pk).first()
    if parent is None:
        raise HttpError(400, f"parent: goal {pk} does not exist.")
    return parent


def _by_activity(goals):
    """Latest activity first: the goal's own change or its runs' latest move, whichever
    came last (one grouped join)."""
    latest = Greatest("updated_at", Coalesce(Max("runs__updated_at"), "updated_at"))
    return goals.annotate(last_activity=latest).order_by("-last_activity", "-pk")


@router.get("/goals", response={200: list[GoalOut], 400: Error, 401: Error},
         summary="List goals with their subtree rollups")
def list_goals(request, status: list[GoalStatusName] = Query(
                   None, description="one or several (status=active&status=blocked)"),
               open: bool = Query(False, description="only goals not closed (active or "
                                                     "blocked); by default every goal"),
               parent: int | None = Query(None, ge=0, le=MAX_ID,
                                          description="0 lists root goals"),
               sort: Literal["title", "activity"] = Query(
                   "title", description="by title, or latest activity (the goal's or any "
                                        "of its runs') first"),
               limit: int = Query(100, ge=1, le=500), offset: int = Query(0, ge=0, le=MAX_ID)):
    goals = Goal.objects.select_related("owner", "opened_by").order_by("title", "pk")
    if sort == "activity":
        goals = _by_activity(goals)
    if status:
        goals = goals.filter(status__in=status)
    if open:
        goals = goals.exclude(status__in=CLOSED_GOAL_STATUSES)
    if parent == 0:
        goals = goals.filter(parent__isnull=True)
    elif parent:
        goals = goals.filter(parent_id=parent)
    page = list(goals[offset:offset + limit])
    sums = rollups(g.pk for g in page)
    return [goal_out(g, sums[g.pk]) for g in page]


@router.post("/goals", response={201: GoalOut, 400: Error, 401: Error, 403: Error},
          summary="Create a goal")
def create_goal(request, payload: GoalIn):
    data = payload.dict()
    goal = Goal(**{**data, "owner": _owner(data["owner"]), "parent": _parent(data["parent"])})
    with transaction.atomic():
        goal_save(goal, actor=request.user)
    return Status(201, goal_out(goal, rollups([goal.pk])[goal.pk]))


@router.get("/goals/{goal_id}", response={200: GoalOut, 400: Error, 401: Error, 404: Error},
         summary="A goal with its subtree rollup")
def get_goal(request, goal_id: Id):
    goal = Goal.objects.select_related("owner", "opened_by").filter(pk=goal_id).first()
    if goal is None:
        raise Http404(f"Goal {goal_id} does not exist.")
    return goal_out(goal, rollups([goal.pk])[goal.pk])


@router.patch("/goals/{goal_id}", response={200: GoalOut, 400: Error, 401: Error, 403: Error,
                                          404: Error, 409: Error},
              summary="Change a goal (closing one with open runs is refused with 409 naming "
                      "them)")
def patch_goal(request, goal_id: Id, payload: GoalPatch):
    goal = Goal.objects.filter(pk=goal_id).first()
    if goal is None:
        raise Http404(f"Goal {goal_id} does not exist.")
    changes = payload.dict(exclude_unset=True)
    if "owner" in changes:
        changes["owner"] = _owner(changes["owner"])
    if "parent" in changes:
        changes["parent"] = _parent(changes["parent"])
    try:
        goal = goal_update(goal, actor=request.user, **changes)
    except ValidationError as exc:
        # What the goal is now makes the change wrong (a parent beneath it; the reason of a
        # goal that stays blocked taken away): a conflict with its state, not bad input.
        codes = {e.code for errors in exc.error_dict.values() for e in errors} \
            if hasattr(exc, "error_dict") else set()
        if "cycle" in codes or ("needs_reason" in codes and "status" not in changes):
            raise HttpError(409, "; ".join(exc.messages)) from None
        raise
    goal = Goal.objects.select_related("owner", "opened_by").get(pk=goal.pk)
    return goal_out(goal, rollups([goal.pk])[goal.pk])

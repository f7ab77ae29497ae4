"""The JSON API (`/api/`), with its OpenAPI document at `/api/openapi.json`.

Authentication is a browser session or `Authorization: Bearer <token>`; a token acts with its
user's permissions only. Errors are `{"error": "..."}` with a 4xx status; every write goes
through the transition engine or the goal services.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, transaction
from django.http import Http404
from django.utils import timezone
from ninja import Body, Field, NinjaAPI, Path, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer, SessionAuth

from goals.models import Goal
from goals.rollup import rollups
from goals.services import goal_save, goal_update

from . import engine
from .models import ApiToken, Checkpoint, Run, Step
from .specs import SpecError, store_spec

MAX_ID = 2**53
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Key = Annotated[str, Path(min_length=1, max_length=100)]


class TokenAuth(HttpBearer):
    def authenticate(self, request, token: str):
        found = (ApiToken.objects.select_related("user")
                 .filter(key_hash=ApiToken.hash(token), revoked_at__isnull=True).first())
        if found is None or not found.user.is_active:
            return None
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > timedelta(seconds=60):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        return found.user


class BrowserSession(SessionAuth):
    """The signed-in browser session, CSRF-checked; no session at all is a 401, not a 403."""

    def __call__(self, request):
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)


api = NinjaAPI(title="Tollgate API", version="1", auth=[TokenAuth(), BrowserSession()],
               urls_namespace="api",
               description="Start runs, report progress, decide gates and read timelines.")


def error(request, message: str, status: int):
    return api.create_response(request, {"error": message}, status=status)


@api.exception_handler(engine.WorkflowError)
def on_workflow_error(request, exc):
    return error(request, str(exc), exc.status_code)


@api.exception_handler(NinjaValidationError)
def on_invalid(request, exc):
    problems = []
    for item in exc.errors:
        where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "payload"))
        problems.append(f"{where}: {item.get('msg', 'invalid')}" if where else item.get("msg"))
    return error(request, "; ".join(problems) or "Invalid request.", 400)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return error(request, "Authentication required: a session or a valid, unrevoked "
                          "Bearer token.", 401)


@api.exception_handler(HttpError)
def on_http_error(request, exc):
    return error(request, str(exc), exc.status_code)


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return error(request, str(exc) or "Not found.", 404)


@api.exception_handler(PermissionDenied)
def on_forbidden(request, exc):
    return error(request, str(exc) or "Not allowed.", 403)


@api.exception_handler(DjangoValidationError)
def on_model_invalid(request, exc):
    return error(request, "; ".join(exc.messages), 400)


@api.exception_handler(DataError)
def on_data_error(request, exc):
    return error(request, "A value is out of range or has characters the database refuses.", 400)


def check_body(request) -> None:
    if b"\\u0000" in request.body or b"\x00" in request.body:
        raise HttpError(400, "NUL characters are not allowed in the request body.")


def get_run(pk: int) -> Run:
    run = Run.objects.select_related("spec", "goal", "requested_by").filter(pk=pk).first()
    if run is None:
        raise Http404(f"Run {pk} does not exist.")
    return run


# --- schemas ------------------------------------------------------------------------------

class Error(Schema):
    error: str


class SpecOut(Schema):
    name: str
    version: int


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
    next_action: str
    success_signal: str
    blocker_reason: str
    shared_state: dict[str, Any]
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    rollup: RollupOut


GoalStatusName = Literal["active", "blocked", "completed", "abandoned", "cancelled"]
PriorityName = Literal["low", "normal", "high", "critical"]


class GoalIn(Schema):
    title: str = Field(min_length=1, max_length=200)
    objective: str = ""
    parent: int | None = Field(None, ge=1, le=MAX_ID)
    status: GoalStatusName = "active"
    priority: PriorityName = "normal"
    owner: str | None = Field(None, description="username")
    next_action: str = Field("", max_length=500)
    success_signal: str = Field("", max_length=500)
    blocker_reason: str = Field("", max_length=500)
    shared_state: dict[str, Any] = {}


class GoalPatch(Schema):
    title: str | None = Field(None, min_length=1, max_length=200)
    objective: str | None = None
    parent: int | None = Field(None, ge=1, le=MAX_ID)
    status: GoalStatusName | None = None
    priority: PriorityName | None = None
    owner: str | None = None
    next_action: str | None = Field(None, max_length=500)
    success_signal: str | None = Field(None, max_length=500)
    blocker_reason: str | None = Field(None, max_length=500)
    shared_state: dict[str, Any] | None = None


class StepOut(Schema):
    key: str
    title: str
    kind: str
    status: str
    attempt: int
    depends_on: list[str]
    approval_group: str
    approval_required: int
    retry_after: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_summary: str


class RunOut(Schema):
    id: int
    spec: str
    spec_version: int
    goal: int | None
    title: str
    status: str
    priority: str
    requested_by: str | None
    idempotency_key: str
    shared_state: dict[str, Any]
    next_action: str
    current_step: str
    error: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reused_existing: bool = False
    steps: list[StepOut] | None = None


class RunPage(Schema):
    count: int
    results: list[RunOut]


class RunIn(Schema):
    spec: str = Field(min_length=1, max_length=100)
    goal: int | None = Field(None, ge=1, le=MAX_ID)
    idempotency_key: str = Field("", max_length=200)
    shared_state: dict[str, Any] | None = None
    title: str = Field("", max_length=200)


class CheckpointOut(Schema):
    seq: int
    kind: str
    step: str | None
    actor: str
    at: datetime
    summary: str
    run_status: str
    step_status: str
    evidence: dict[str, Any]
    state_patch: dict[str, Any]


class ResumeOut(Schema):
    resume_state: str
    can_resume: bool
    next_step: str | None
    message: str


class TransitionIn(Schema):
    step: str = Field(min_length=1, max_length=100)
    step_status: Literal["running", "completed", "failed", "blocked"] | None = None
    summary: str = Field("", max_length=10000)
    evidence: dict[str, Any] | None = None
    state_patch: dict[str, Any] | None = None


class TransitionOut(Schema):
    checkpoint: CheckpointOut
    run: RunOut


class CancelIn(Schema):
    reason: str = Field("", max_length=500)


class SkipIn(Schema):
    reason: str = Field(min_length=1, max_length=500)


class DecisionIn(Schema):
    comment: str = Field("", max_length=5000)


def goal_out(goal: Goal, rollup) -> dict:
    return {**{f: getattr(goal, f) for f in (
        "id", "title", "objective", "status", "priority", "next_action", "success_signal",
        "blocker_reason", "shared_state", "opened_at", "updated_at", "closed_at")},
        "parent": goal.parent_id, "owner": goal.owner.get_username() if goal.owner else None,
        "rollup": rollup.as_dict()}


def run_out(run: Run, *, steps=None, reused: bool = False) -> dict:
    data = {f: getattr(run, f) for f in (
        "id", "title", "status", "priority", "idempotency_key", "shared_state", "next_action",
        "current_step", "error", "created_at", "started_at", "finished_at")}
    data.update(spec=run.spec_name, spec_version=run.spec.version, goal=run.goal_id,
                requested_by=run.requested_by.get_username() if run.requested_by else None,
                reused_existing=reused)
    if steps is not None:
        data["steps"] = [{f: getattr(s, f) for f in StepOut.model_fields} for s in steps]
    return data


def checkpoint_out(c: Checkpoint, keys: dict[int, str]) -> dict:
    return {"seq": c.seq, "kind": c.kind, "step": keys.get(c.step_id), "actor": c.actor_name,
            "at": c.at, "summary": c.summary, "run_status": c.run_status,
            "step_status": c.step_status, "evidence": c.evidence, "state_patch": c.state_patch}


def fresh_run(pk: int, *, reused: bool = False) -> dict:
    run = get_run(pk)
    return run_out(run, steps=list(run.steps.order_by("index")), reused=reused)


# --- specs --------------------------------------------------------------------------------

@api.post("/specs", response={201: SpecOut, 400: Error, 401: Error, 403: Error},
          summary="Validate and store a spec")
def create_spec(request, payload: dict[str, Any] = Body(...)):
    check_body(request)
    try:
        spec, _ = store_spec(payload, actor=request.user)
    except SpecError as exc:
        raise HttpError(400, str(exc)) from None
    return Status(201, {"name": spec.name, "version": spec.version})


# --- goals --------------------------------------------------------------------------------

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


@api.get("/goals", response={200: list[GoalOut], 400: Error, 401: Error},
         summary="List goals with their subtree rollups")
def list_goals(request, status: GoalStatusName | None = None,
               parent: int | None = Query(None, ge=0, le=MAX_ID,
                                          description="0 lists root goals"),
               limit: int = Query(100, ge=1, le=500), offset: int = Query(0, ge=0, le=MAX_ID)):
    goals = Goal.objects.select_related("owner").order_by("title", "pk")
    if status:
        goals = goals.filter(status=status)
    if parent == 0:
        goals = goals.filter(parent__isnull=True)
    elif parent:
        goals = goals.filter(parent_id=parent)
    page = list(goals[offset:offset + limit])
    sums = rollups(g.pk for g in page)
    return [goal_out(g, sums[g.pk]) for g in page]


@api.post("/goals", response={201: GoalOut, 400: Error, 401: Error, 403: Error},
          summary="Create a goal")
def create_goal(request, payload: GoalIn):
    check_body(request)
    data = payload.dict()
    goal = Goal(**{**data, "owner": _owner(data["owner"]), "parent": _parent(data["parent"])})
    with transaction.atomic():
        goal_save(goal, actor=request.user)
    return Status(201, goal_out(goal, rollups([goal.pk])[goal.pk]))


@api.get("/goals/{goal_id}", response={200: GoalOut, 400: Error, 401: Error, 404: Error},
         summary="A goal with its subtree rollup")
def get_goal(request, goal_id: Id):
    goal = Goal.objects.select_related("owner").filter(pk=goal_id).first()
    if goal is None:
        raise Http404(f"Goal {goal_id} does not exist.")
    return goal_out(goal, rollups([goal.pk])[goal.pk])


@api.patch("/goals/{goal_id}", response={200: GoalOut, 400: Error, 401: Error, 403: Error,
                                          404: Error}, summary="Change a goal")
def patch_goal(request, goal_id: Id, payload: GoalPatch):
    check_body(request)
    goal = Goal.objects.filter(pk=goal_id).first()
    if goal is None:
        raise Http404(f"Goal {goal_id} does not exist.")
    changes = payload.dict(exclude_unset=True)
    if "owner" in changes:
        changes["owner"] = _owner(changes["owner"])
    if "parent" in changes:
        changes["parent"] = _parent(changes["parent"])
    for name in [k for k, v in changes.items() if v is None and k not in ("owner", "parent")]:
        raise HttpError(400, f"{name}: may not be null.")
    goal = goal_update(goal, actor=request.user, **changes)
    goal = Goal.objects.select_related("owner").get(pk=goal.pk)
    return goal_out(goal, rollups([goal.pk])[goal.pk])


# --- runs ---------------------------------------------------------------------------------

@api.post("/runs", response={200: RunOut, 201: RunOut, 400: Error, 401: Error, 403: Error,
                             404: Error, 409: Error},
          summary="Start a run (idempotent with an idempotency key)")
def create_run(request, payload: RunIn):
    check_body(request)
    opened = engine.open_run(payload.spec, actor=request.user, goal=payload.goal,
                             idempotency_key=payload.idempotency_key,
                             shared_state=payload.shared_state, title=payload.title)
    return Status(200 if opened.reused else 201, fresh_run(opened.run.pk, reused=opened.reused))


RunStatusName = Literal["open", "running", "blocked", "waiting_approval", "failed", "completed",
                        "cancelled"]


@api.get("/runs", response={200: RunPage, 400: Error, 401: Error}, summary="List runs")
def list_runs(request, status: RunStatusName | None = None,
              spec: str | None = Query(None, max_length=100),
              goal: int | None = Query(None, ge=1, le=MAX_ID),
              limit: int = Query(50, ge=1, le=200), offset: int = Query(0, ge=0, le=MAX_ID)):
    runs = Run.objects.select_related("spec", "goal", "requested_by").order_by("-created_at",
                                                                              "-id")
    if status:
        runs = runs.filter(status=status)
    if spec:
        runs = runs.filter(spec_name=spec)
    if goal:
        runs = runs.filter(goal_id=goal)
    return {"count": runs.count(), "results": [run_out(r) for r in runs[offset:offset + limit]]}


@api.get("/runs/{run_id}", response={200: RunOut, 400: Error, 401: Error, 404: Error},
         summary="A run with its steps")
def get_run_detail(request, run_id: Id):
    return fresh_run(run_id)


@api.get("/runs/{run_id}/timeline", response={200: list[CheckpointOut], 400: Error,
                                                    401: Error, 404: Error},
         summary="The run's checkpoints, oldest first")
def timeline(request, run_id: Id):
    run = get_run(run_id)
    keys = dict(Step.objects.filter(run=run).values_list("pk", "key"))
    return [checkpoint_out(c, keys) for c in run.checkpoints.order_by("seq")]


@api.get("/runs/{run_id}/resume", response={200: ResumeOut, 400: Error, 401: Error, 404: Error},
         summary="Where the run stands and what would move it on")
def resume(request, run_id: Id):
    return engine.resume_state(get_run(run_id))


@api.post("/runs/{run_id}/transition",
          response={200: TransitionOut, 400: Error, 401: Error, 403: Error, 404: Error,
                    409: Error},
          summary="Report progress on a step the caller performs itself")
def transition(request, run_id: Id, payload: TransitionIn):
    check_body(request)
    run = get_run(run_id)
    checkpoint = engine.record_transition(
        run, payload.step, actor=request.user, step_status=payload.step_status,
        summary=payload.summary, evidence=payload.evidence, state_patch=payload.state_patch)
    keys = {checkpoint.step_id: payload.step}
    return {"checkpoint": checkpoint_out(checkpoint, keys), "run": fresh_run(run.pk)}


@api.post("/runs/{run_id}/cancel", response={200: RunOut, 400: Error, 401: Error, 403: Error,
                                              404: Error, 409: Error}, summary="Cancel a run")
def cancel(request, run_id: Id, payload: CancelIn | None = None):
    run = get_run(run_id)
    engine.cancel_run(run, actor=request.user, reason=payload.reason if payload else "")
    return fresh_run(run.pk)


DECIDE = {200: RunOut, 400: Error, 401: Error, 403: Error, 404: Error, 409: Error}


@api.post("/runs/{run_id}/steps/{key}/approve", response=DECIDE, summary="Approve a gate")
def approve(request, run_id: Id, key: Key, payload: DecisionIn | None = None):
    engine.approve(get_run(run_id), key, user=request.user,
                   comment=payload.comment if payload else "")
    return fresh_run(run_id)


@api.post("/runs/{run_id}/steps/{key}/reject", response=DECIDE,
          summary="Reject a gate (a comment is required)")
def reject(request, run_id: Id, key: Key, payload: DecisionIn):
    engine.reject(get_run(run_id), key, user=request.user, comment=payload.comment)
    return fresh_run(run_id)


@api.post("/runs/{run_id}/steps/{key}/retry", response=DECIDE, summary="Retry a failed step")
def retry(request, run_id: Id, key: Key):
    engine.retry_step(get_run(run_id), key, actor=request.user)
    return fresh_run(run_id)


@api.post("/runs/{run_id}/steps/{key}/skip", response=DECIDE,
          summary="Skip a work step (a gate is never skipped)")
def skip(request, run_id: Id, key: Key, payload: SkipIn):
    engine.skip_step(get_run(run_id), key, actor=request.user, reason=payload.reason)
    return fresh_run(run_id)


def urls():
    """The API's URL patterns, open to LoginRequiredMiddleware: the API answers 401 itself."""
    from django.contrib.auth.decorators import login_not_required

    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        pattern.callback = login_not_required(pattern.callback)
    return patterns, app_name, namespace


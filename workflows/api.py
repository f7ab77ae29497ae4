"""The workflows API: specs, runs, their timelines, and the buttons (approve, reject, retry,
skip, cancel) for scripts and agents. Every write goes through the engine."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.db import transaction
from django.http import Http404
from ninja import Body, Field, Path, Query, Router, Schema, Status
from ninja.errors import HttpError

from goals.models import Priority
from tollgate.exports import csv_download
from tollgate.query import MAX_ID
from tollgate.schemas import Day, Error, Id, Input, Key
from workflows.ops import operations
from workflows.recovery import presence
from workflows.recovery.recover import recover_run
from workflows.specs.storage import set_spec_status, store_one_off, store_spec
from workflows.specs.validation import SpecError

from . import engine, selectors
from .models import Checkpoint, Run, RunStatus, SpecStatus, StepStatus
from .permissions import can_change_specs, readable_runs
from .selectors import resume_state

router = Router(tags=["workflows"])

RunStatusName = Literal[tuple(RunStatus.values)]
StepStatusName = Literal[tuple(StepStatus.values)]
SpecStatusName = Literal[tuple(SpecStatus.values)]


def get_run(request, pk: int) -> Run:
    """The run, if it exists and the caller may read it (else 404: not even that it exists)."""
    run = (readable_runs(request.user).select_related("spec", "goal", "requested_by",
                                                     "parent_step")
           .filter(pk=pk).first())
    if run is None:
        raise Http404(f"Run {pk} does not exist.")
    return run


class SpecOut(Schema):
    name: str
    version: int


class StepOut(Schema):
    key: str
    title: str
    kind: str
    status: StepStatusName
    attempt: int
    depends_on: list[str]
    approval_group: str
    approval_required: int
    retry_after: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_summary: str
    child_run: int | None = Field(None, description="the run a workflow step opened and "
                                                    "waits for (its current attempt's)")


class ParentOut(Schema):
    run: int
    step: str


class RunOut(Schema):
    id: int
    spec: str
    spec_version: int
    goal: int | None
    title: str
    status: RunStatusName
    priority: str
    requested_by: str | None
    idempotency_key: str
    shared_state: dict[str, Any]
    params: dict[str, Any]
    next_action: str
    current_step: str
    error: str
    kind: str
    ref: str
    blocker_reason: str
    parent: ParentOut | None = Field(None, description="for a child run: the run and step "
                                                       "that opened it and wait for it")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reused_existing: bool = False
    steps: list[StepOut] | None = None


class RunPage(Schema):
    count: int
    results: list[RunOut]


class RunIn(Input):
    spec: str = Field(min_length=1, max_length=100)
    goal: int | None = Field(None, ge=1, le=MAX_ID)
    idempotency_key: str = Field("", max_length=200)
    shared_state: dict[str, Any] | None = None
    params: dict[str, Any] | None = Field(None, description="the spec's typed run parameters")
    title: str = Field("", max_length=200)
    priority: Literal[tuple(Priority.values)] | None = Field(
        None, description="workers serve higher priorities first (default: the goal's, else "
                          "normal)")
    reuse: Literal["open", "any", "none"] = Field(
        "open", description="a key already used: return its open run (open), its latest run "
                            "whatever its status (any), or refuse it (none)")
    next_action: str = Field("", max_length=500, description="what should happen next, in "
                                                             "the caller's words")
    kind: str = Field("", max_length=50, description="what sort of run this is")
    ref: str = Field("", max_length=200, description="an outside reference (a ticket, a "
                                                     "session id) to find the run by")
    steps: list[dict[str, Any]] | None = Field(
        None, description="inline steps: a one-off version of the spec named by `spec`, "
                          "validated and authorised like any spec")


class CheckpointOut(Schema):
    seq: int
    kind: str
    step: str | None
    actor: str
    at: datetime
    label: str
    summary: str
    run_status: RunStatusName
    step_status: StepStatusName | Literal[""]
    evidence: dict[str, Any]
    state_patch: dict[str, Any]


class ResumeOut(Schema):
    resume_state: str
    can_resume: bool
    next_step: str | None
    message: str


class TransitionIn(Input):
    step: str = Field(min_length=1, max_length=100)
    step_status: Literal[tuple(map(str, engine.AGENT_STATUSES))] | None = None
    summary: str = Field("", max_length=10000)
    evidence: dict[str, Any] | None = None
    state_patch: dict[str, Any] | None = None
    next_action: str | None = Field(None, max_length=500,
                                    description="the run's next action (\"\" clears it)")
    label: str = Field("", max_length=100, description="a name for this checkpoint")
    blocker_reason: str = Field("", max_length=500,
                                description="why the run is blocked (with step_status "
                                            "blocked)")
    shared_state_mode: Literal["merge", "replace"] = Field(
        "merge", description="merge the state patch into the shared state, or replace it")


class TransitionOut(Schema):
    checkpoint: CheckpointOut
    run: RunOut


class CancelIn(Input):
    reason: str = Field("", max_length=500)


class SkipIn(Input):
    reason: str = Field(min_length=1, max_length=500)


class DecisionIn(Input):
    comment: str = Field("", max_length=5000)


class RejectIn(Input):
    comment: str = Field(min_length=1, max_length=5000, description="why: required to reject")


class ApproveIn(DecisionIn):
    values: dict[str, Any] | None = Field(
        None, description="the gate's form (approval.form), filled in: field name: value")


def run_out(run: Run, *, steps=None, reused: bool = False) -> dict:
    data = {f: getattr(run, f) for f in (
        "id", "title", "status", "priority", "idempotency_key", "shared_state", "params",
        "current_step", "error", "kind", "ref", "blocker_reason", "created_at", "started_at",
        "finished_at")}
    data.update(spec=run.spec_name, spec_version=run.spec.version, goal=run.goal_id,
                next_action=run.what_next,
                parent={"run": run.parent_step.run_id, "step": run.parent_step.key}
                if run.parent_step_id else None,
                requested_by=run.requested_by.get_username() if run.requested_by else None,
                reused_existing=reused)
    if steps is not None:
        data["steps"] = [{f: getattr(s, "child_run_id" if f == "child_run" else f)
                          for f in StepOut.model_fields} for s in steps]
    return data


def checkpoint_out(c: Checkpoint, step_key: str | None = None) -> dict:
    key = step_key or getattr(c, "step_key", None) or None
    return {"seq": c.seq, "kind": c.kind, "step": key, "actor": c.actor_name,
            "at": c.at, "label": c.label, "summary": c.summary, "run_status": c.run_status,
            "step_status": c.step_status, "evidence": c.evidence, "state_patch": c.state_patch}


def fresh_run(request, pk: int, *, reused: bool = False) -> dict:
    run = get_run(request, pk)
    return run_out(run, steps=list(run.steps.order_by("index")), reused=reused)


class SpecSummary(Schema):
    name: str
    version: int
    status: SpecStatusName
    description: str
    versions: int
    runs: int


class SpecVersionOut(Schema):
    version: int
    status: SpecStatusName
    created_at: datetime
    runs: int
    definition: dict[str, Any]


class SpecDetail(Schema):
    name: str
    active_version: int | None
    versions: list[SpecVersionOut]


class SpecStatusIn(Input):
    version: int = Field(ge=1, le=MAX_ID)


@router.get("/specs", response={200: list[SpecSummary], 400: Error, 401: Error},
            summary="Specs (active by default), with how many versions and runs each has")
def list_specs(request, status: SpecStatusName | Literal["any"] = Query(
                   "active", description="active (one version per name), archived, or any"),
               limit: int | None = Query(None, ge=1, le=1000)):
    return selectors.active_specs("" if status == "any" else status, limit)


@router.get("/specs/{name}", response={200: SpecDetail, 400: Error, 401: Error, 404: Error},
            summary="A spec's versions, definitions and runs per version")
def get_spec(request, name: Annotated[str, Path(min_length=1, max_length=100)]):
    detail = selectors.spec_detail(name, reveal=can_change_specs(request.user))
    if detail is None:
        raise Http404(f"No spec named {name!r}.")
    return detail


SpecName = Annotated[str, Path(min_length=1, max_length=100)]
SPEC_CHANGE = {200: SpecDetail, 400: Error, 401: Error, 403: Error, 404: Error}
SPEC_STATUS_FOR = {"archive": SpecStatus.ARCHIVED, "activate": SpecStatus.ACTIVE}


@router.post("/specs/{name}/{action}", response=SPEC_CHANGE,
             summary="Archive a version, or make it the active one "
                     "(workflows.change_workflowspec)")
def change_spec_status(request, name: SpecName, action: Literal["archive", "activate"],
                       payload: SpecStatusIn):
    set_spec_status(name, payload.version, SPEC_STATUS_FOR[action], actor=request.user)
    return selectors.spec_detail(name, reveal=can_change_specs(request.user))


@router.post("/specs", response={201: SpecOut, 400: Error, 401: Error, 403: Error},
          summary="Validate and store a spec")
def create_spec(request, payload: dict[str, Any] = Body(...)):
    try:
        spec, _ = store_spec(payload, actor=request.user)
    except SpecError as exc:
        raise HttpError(400, str(exc)) from None
    return Status(201, {"name": spec.name, "version": spec.version})


@router.post("/runs", response={200: RunOut, 201: RunOut, 400: Error, 401: Error, 403: Error,
                             404: Error, 409: Error},
          summary="Start a run (idempotent with an idempotency key)")
def create_run(request, payload: RunIn):
    # Inline steps are stored with the run or not at all: a refused start keeps no version.
    with transaction.atomic():
        spec = payload.spec
        if payload.steps is not None:
            try:
                spec = store_one_off({"name": payload.spec, "steps": payload.steps},
                                     actor=request.user)
            except SpecError as exc:
                raise HttpError(400, str(exc)) from None
        opened = engine.open_run(spec, actor=request.user, goal=payload.goal,
                                 idempotency_key=payload.idempotency_key,
                                 shared_state=payload.shared_state, title=payload.title,
                                 params=payload.params, priority=payload.priority,
                                 reuse=payload.reuse, next_action=payload.next_action,
                                 kind=payload.kind, ref=payload.ref)
    return Status(200 if opened.reused else 201,
                  fresh_run(request, opened.run.pk, reused=opened.reused))


@router.get("/runs", response={200: RunPage, 400: Error, 401: Error}, summary="List runs")
def list_runs(request, status: list[RunStatusName] = Query(
                  None, description="one or several (status=open&status=running)"),
              open: bool = Query(False, description="only runs not yet ended"),
              spec: str | None = Query(None, max_length=100),
              goal: int | None = Query(None, ge=1, le=MAX_ID),
              kind: str = Query("", max_length=50),
              ref: str = Query("", max_length=200, description="the outside reference, exactly"),
              q: str = Query("", max_length=200,
                             description="title, idempotency key, spec name or requester"),
              requester: str = Query("", max_length=150),
              opened_from: str | None = Day(), opened_to: str | None = Day(),
              finished_from: str | None = Day(), finished_to: str | None = Day(),
              limit: int = Query(50, ge=1, le=200), offset: int = Query(0, ge=0, le=MAX_ID)):
    days = {}
    for name, value in (("opened_from", opened_from), ("opened_to", opened_to),
                        ("finished_from", finished_from), ("finished_to", finished_to)):
        days[name] = selectors.parse_day(value or "")
        if value and days[name] is None:
            raise HttpError(400, f"{name}: {value!r} is not a date (YYYY-MM-DD).")
    runs = readable_runs(request.user, selectors.runs(
        status=status or [], spec=spec or "", goal=goal, q=q, requester=requester,
        open_only=open, kind=kind, ref=ref, **days))
    return {"count": runs.count(), "results": [run_out(r) for r in runs[offset:offset + limit]]}


@router.get("/runs/{run_id}", response={200: RunOut, 400: Error, 401: Error, 404: Error},
         summary="A run with its steps")
def get_run_detail(request, run_id: Id):
    return fresh_run(request, run_id)


@router.get("/runs/{run_id}/timeline", response={200: list[CheckpointOut], 400: Error,
                                                    401: Error, 404: Error},
         summary="The run's checkpoints: oldest first, or newest first, paged by seq")
def timeline(request, run_id: Id,
             order: Literal["oldest", "newest"] = "oldest",
             limit: int | None = Query(None, ge=1, le=10000),
             after: int | None = Query(None, ge=0, le=MAX_ID, description="seq greater than"),
             before: int | None = Query(None, ge=1, le=MAX_ID, description="seq less than")):
    return [checkpoint_out(c) for c in selectors.timeline(
        get_run(request, run_id), after=after, before=before,
        newest_first=order == "newest", limit=limit)]


@router.get("/runs/{run_id}/resume", response={200: ResumeOut, 400: Error, 401: Error, 404: Error},
         summary="Where the run stands and what would move it on")
def resume(request, run_id: Id):
    return resume_state(get_run(request, run_id))


@router.post("/runs/{run_id}/transition",
          response={200: TransitionOut, 400: Error, 401: Error, 403: Error, 404: Error,
                    409: Error},
          summary="Report progress on a step the caller performs itself")
def transition(request, run_id: Id, payload: TransitionIn):
    run = get_run(request, run_id)
    checkpoint = engine.record_transition(
        run, payload.step, actor=request.user, step_status=payload.step_status,
        summary=payload.summary, evidence=payload.evidence, state_patch=payload.state_patch,
        next_action=payload.next_action, label=payload.label,
        blocker_reason=payload.blocker_reason, shared_state_mode=payload.shared_state_mode)
    return {"checkpoint": checkpoint_out(checkpoint, payload.step),
            "run": fresh_run(request, run.pk)}


@router.post("/runs/{run_id}/cancel", response={200: RunOut, 400: Error, 401: Error, 403: Error,
                                              404: Error, 409: Error}, summary="Cancel a run")
def cancel(request, run_id: Id, payload: CancelIn | None = None):
    run = get_run(request, run_id)
    engine.cancel_run(run, actor=request.user, reason=payload.reason if payload else "")
    return fresh_run(request, run.pk)


DECIDE = {200: RunOut, 400: Error, 401: Error, 403: Error, 404: Error, 409: Error}


@router.post("/runs/{run_id}/steps/{key}/approve", response=DECIDE,
             summary="Approve a gate (with its form's values, if it has a form)")
def approve(request, run_id: Id, key: Key, payload: ApproveIn | None = None):
    engine.approve(get_run(request, run_id), key, user=request.user,
                   comment=payload.comment if payload else "",
                   values=payload.values if payload else None)
    return fresh_run(request, run_id)


@router.post("/runs/{run_id}/steps/{key}/reject", response=DECIDE,
          summary="Reject a gate (a comment is required)")
def reject(request, run_id: Id, key: Key, payload: RejectIn):
    engine.reject(get_run(request, run_id), key, user=request.user, comment=payload.comment)
    return fresh_run(request, run_id)


@router.post("/runs/{run_id}/steps/{key}/retry", response=DECIDE, summary="Retry a failed step")
def retry(request, run_id: Id, key: Key):
    engine.retry_step(get_run(request, run_id), key, actor=request.user)
    return fresh_run(request, run_id)


@router.post("/runs/{run_id}/steps/{key}/skip", response=DECIDE,
          summary="Skip a work step (a gate is never skipped)")
def skip(request, run_id: Id, key: Key, payload: SkipIn):
    engine.skip_step(get_run(request, run_id), key, actor=request.user, reason=payload.reason)
    return fresh_run(request, run_id)


class VerdictOut(Schema):
    step: str
    holder: str
    action: str


class RecoverOut(Schema):
    checked: list[VerdictOut]
    run: RunOut


@router.post("/runs/{run_id}/recover", response={200: RecoverOut, 400: Error, 401: Error,
                                                 403: Error, 404: Error, 409: Error},
             summary="Check each running step now and reclaim those whose worker is gone")
def recover(request, run_id: Id):
    verdicts = recover_run(get_run(request, run_id), actor=request.user)
    return {"checked": [vars(v) for v in verdicts], "run": fresh_run(request, run_id)}


@router.get("/runs/{run_id}/audit", response={200: dict[str, Any], 400: Error, 401: Error,
                                               404: Error},
            summary="The run's timeline and decisions, for the record")
def run_audit(request, run_id: Id):
    return selectors.run_audit(get_run(request, run_id))


class AddStepsIn(Input):
    steps: list[dict[str, Any]] = Field(min_length=1, max_length=200,
                                        description="steps as in a spec")


@router.post("/runs/{run_id}/steps", response={201: RunOut, 400: Error, 401: Error, 403: Error,
                                                404: Error, 409: Error},
             summary="Add steps to an open run (the requester or an operator)")
def add_steps(request, run_id: Id, payload: AddStepsIn):
    engine.add_steps(get_run(request, run_id), payload.steps, actor=request.user)
    return Status(201, fresh_run(request, run_id))


# CSV, not JSON: kept out of the OpenAPI document, which describes JSON answers.
@router.get("/runs/{run_id}/audit.csv", include_in_schema=False)
def run_audit_csv(request, run_id: Id):
    run = get_run(request, run_id)
    header, rows = selectors.audit_rows(selectors.run_audit(run))
    return csv_download(rows, header, f"run-{run.pk}-audit.csv")


class HeldOut(Schema):
    kind: Literal["step", "compensation"]
    id: int
    run: int | None
    step: str


class WorkerOut(Schema):
    host: str
    pid: int
    boot_id: str
    pidns: str
    started: datetime = Field(description="first seen")
    last_seen: datetime
    state: Literal["alive", "gone", "silent"]
    holds: list[HeldOut]


class PeriodicOut(Schema):
    name: str
    last_started: datetime
    last_finished: datetime | None
    last_seconds: float | None
    last_error: str
    runs: int


class WorkersOut(Schema):
    workers: list[WorkerOut]
    periodic: list[PeriodicOut]
    warning: str


@router.get("/workers", response={200: WorkersOut, 401: Error, 403: Error},
            summary="Every consumer seen in the last day (alive, gone or silent) with what "
                    "it holds, and the periodic tasks' last runs (operators)")
def list_workers(request):
    from django.utils import timezone as tz

    engine.require_operator(request.user, "see the workers")
    now = tz.now()
    return {"workers": [{"host": w.host, "pid": w.pid, "boot_id": w.boot_id,
                         "pidns": w.pidns, "started": w.first_seen, "last_seen": w.last_seen,
                         "state": w.state,
                         "holds": [{k: h[k] for k in ("kind", "id", "run", "step")}
                                   for h in w.held]}
                        for w in operations.workers(now)],
            "periodic": [{f: getattr(p, f) for f in PeriodicOut.model_fields}
                         for p in operations.periodic_runs()],
            "warning": presence.sweeper_late(now)}

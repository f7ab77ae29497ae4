"""Runs: start (idempotent with a key), list, read, timeline, where it stands (resume), reports
on wait steps (/transition), cancel, recover, audit, steps added while it runs."""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from ninja import Field, Query, Router, Schema, Status
from ninja.errors import HttpError
from pydantic import ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from goals.models import Priority
from tollgate.exports import csv_download
from tollgate.query import MAX_ID
from tollgate.schemas import DAY, Day, Error, Id, Input, WholeId
from workflows import engine
from workflows.api.schemas import (
    CheckpointOut,
    RunOut,
    RunPage,
    RunStatusName,
    checkpoint_out,
    fresh_run,
    get_run,
    run_out,
)
from workflows.people.permissions import readable_runs
from workflows.reads import selectors
from workflows.reads.selectors import resume_state
from workflows.recovery.recover import recover_run
from workflows.specs.storage import store_one_off
from workflows.specs.validation import SpecError

router = Router(tags=["workflows"])


class RunIn(Input):
    spec: str = Field(min_length=1, max_length=100)
    goal: WholeId | None = None
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
    owner: str | None = Field(None, min_length=1, max_length=150, description=(
        "open it for this person (a username), who is then its requester: four-eyes keeps "
        "them from deciding it. Needs the permission to open runs on someone else's behalf"))
    steps: list[dict[str, Any] | str] | None = Field(
        None, description="inline steps: a one-off version of the spec named by `spec`, "
                          "validated and authorised like any spec")


class ResumeOut(Schema):
    resume_state: str
    can_resume: bool
    next_step: str | None
    message: str


# Fields other runtimes take on a transition, each refused with Tollgate's way to do it
# (docs/benchmarks.md, "The runtimes we follow", lists them): a report never sets what the engine
# derives, nor skips a gate or marks a worker's step done.
FOREIGN_TRANSITION_FIELDS = {
    "run_status": "a run's status follows from its steps: report the step's step_status; "
                  "POST /api/runs/{id}/cancel ends a run",
    "owner": "a step has no owner: who reports is the API token's user (the step's "
             "reported_by)",
    "actor": "who reports is the API token's user: give each agent its own token "
             "(manage.py create_token) and name the checkpoint with label",
    "step_title": "a step's title is its spec's: add a step with its title through "
                  "POST /api/runs/{id}/steps",
    "max_retries": "retries are the spec's (max_retries on the step); "
                   "POST /api/runs/{id}/steps/{key}/retry retries a failed step",
    "retry_policy": "the retry policy is the spec's (retry_backoff, retry_backoff_seconds on "
                    "the step)",
    "retry_after": "when an automatic retry starts is the spec's backoff "
                   "(retry_backoff_seconds on the step); to try a failed step again now, an "
                   "operator calls POST /api/runs/{id}/steps/{key}/retry, and a wait step's "
                   "new attempt begins when it is reported running",
    "requires_approval": "a gate is a step with approval, in the spec or added by an "
                         "operator through POST /api/runs/{id}/steps; a report never passes "
                         "or skips one",
    "compensation": "a compensation is declared on the step, in the spec or when the step is "
                    "added",
}


class TransitionIn(Input):
    # Replacing the shared state needs the new state; a step's status, and a blocker reason
    # (with a step reported blocked), name the step.
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": {"required": ["shared_state_mode"],
                "properties": {"shared_state_mode": {"const": "replace"}}},
         "then": {"required": ["state_patch"],
                  "properties": {"state_patch": {"type": "object"}}}},
        {"if": {"required": ["blocker_reason"],
                "properties": {"blocker_reason": {"minLength": 1}}},
         "then": {"required": ["step", "step_status"],
                  "properties": {"step_status": {"const": "blocked"}}}},
        {"if": {"required": ["step_status"], "properties": {"step_status": {"type": "string"}}},
         "then": {"required": ["step"], "properties": {"step": {"type": "string"}}}},
        # About a step, or a note on the run that says something.
        {"anyOf": [{"required": ["step"], "properties": {"step": {"type": "string"}}},
                   {"required": ["next_action"],
                    "properties": {"next_action": {"type": "string"}}},
                   *({"required": [name], "properties": {name: {"minLength": 1}}}
                     for name in ("summary", "label")),
                   *({"required": [name],
                      "properties": {name: {"type": "object", "minProperties": 1}}}
                     for name in ("evidence", "state_patch"))]}]})

    step: str | None = Field(None, min_length=1, max_length=100,
                             description="the step reported on; without it, a note on the "
                                         "run (a checkpoint that moves no status)")
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

    @model_validator(mode="before")
    @classmethod
    def _tollgates_way(cls, data):
        if isinstance(data, dict):
            for name, way in FOREIGN_TRANSITION_FIELDS.items():
                if name in data or (name == "run_status" and "status" in data):
                    raise PydanticCustomError(
                        "foreign_field", "{field} is not taken: {way}",
                        {"field": "status" if "status" in data else name, "way": way})
        return data


class TransitionOut(Schema):
    checkpoint: CheckpointOut
    run: RunOut


class CancelIn(Input):
    reason: str = Field("", max_length=500)


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
                                 kind=payload.kind, ref=payload.ref, owner=payload.owner)
    return Status(200 if opened.reused else 201,
                  fresh_run(request, opened.run.pk, reused=opened.reused))


@router.get("/runs", response={200: RunPage, 400: Error, 401: Error}, summary="List runs")
def list_runs(request, status: list[RunStatusName] = Query(
                  None, description="one or several (status=open&status=running)"),
              open: bool = Query(False, description="only runs not yet ended"),
              spec: str | None = Query(None, max_length=100),
              goal: int | None = Query(None, ge=1, le=MAX_ID),
              parent: int | None = Query(None, ge=1, le=MAX_ID,
                                         description="runs opened by this run's steps"),
              schedule: int | None = Query(None, ge=1, le=MAX_ID,
                                           description="runs this schedule started"),
              kind: str = Query("", max_length=50),
              ref: str = Query("", max_length=200, description="the outside reference, exactly"),
              q: str = Query("", max_length=200,
                             description="title, idempotency key, spec name or requester"),
              requester: str = Query("", max_length=150),
              opened_from: Day | None = Query(None, description=DAY),
              opened_to: Day | None = Query(None, description=DAY),
              finished_from: Day | None = Query(None, description=DAY),
              finished_to: Day | None = Query(None, description=DAY),
              sort: Literal["created", "activity"] = Query(
                  "created", description="newest opened first, or latest activity first"),
              limit: int = Query(50, ge=1, le=200), offset: int = Query(0, ge=0, le=MAX_ID)):
    days = {"opened_from": opened_from, "opened_to": opened_to,
            "finished_from": finished_from, "finished_to": finished_to}
    runs = readable_runs(request.user, selectors.runs(
        status=status or [], spec=spec or "", goal=goal, q=q, requester=requester,
        open_only=open, kind=kind, ref=ref, parent=parent, schedule=schedule, sort=sort,
        **days))
    return {"count": runs.count(), "results": [run_out(r) for r in runs[offset:offset + limit]]}


@router.get("/runs/{run_id}", response={200: RunOut, 400: Error, 401: Error, 404: Error},
         summary="A run with its steps")
def get_run_detail(request, run_id: Id):
    run = get_run(request, run_id)
    return {**run_out(run, steps=list(run.steps.order_by("index"))),
            "record_warning": selectors.chain_warning(run)}


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


@router.get("/runs/{run_id}/state", response={200: dict[str, Any], 400: Error, 401: Error,
                                             404: Error},
            summary="The shared state now, or as it stood after a checkpoint")
def run_state(request, run_id: Id, at: int | None = Query(
        None, ge=1, description="a checkpoint's seq: the state as it stood after it")):
    run = get_run(request, run_id)
    return run.shared_state if at is None else selectors.state_at(run, at)


@router.get("/runs/{run_id}/resume", response={200: ResumeOut, 400: Error, 401: Error, 404: Error},
         summary="Where the run stands and what would move it on")
def resume(request, run_id: Id):
    return resume_state(get_run(request, run_id))


@router.post("/runs/{run_id}/transition",
          response={200: TransitionOut, 400: Error, 401: Error, 403: Error, 404: Error,
                    409: Error},
          summary="Report progress on a step the caller performs itself, or note on the run")
def transition(request, run_id: Id, payload: TransitionIn):
    run = get_run(request, run_id)
    if payload.step is None:
        if payload.step_status or payload.blocker_reason:
            raise engine.InvalidInput("step_status and blocker_reason are a step's: name the "
                                      "step (a report without one is a note on the run).")
        checkpoint = engine.record_note(
            run, actor=request.user, summary=payload.summary, evidence=payload.evidence,
            state_patch=payload.state_patch, label=payload.label,
            next_action=payload.next_action, shared_state_mode=payload.shared_state_mode)
        return {"checkpoint": checkpoint_out(checkpoint), "run": fresh_run(request, run.pk)}
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
    steps: list[dict[str, Any] | str] = Field(min_length=1, max_length=200,
                                        description="steps as in a spec; each may also "
                                                    "carry status and step_index")


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

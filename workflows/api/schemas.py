"""What the workflows API's resources share: the run, step and checkpoint shapes, and
reading a run the caller may see."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import Http404
from ninja import Field, Schema

from workflows.models import Checkpoint, Run, RunStatus, SpecStatus, StepStatus
from workflows.people.permissions import readable_runs

RunStatusName = Literal[tuple(RunStatus.values)]


StepStatusName = Literal[tuple(StepStatus.values)]


SpecStatusName = Literal[tuple(SpecStatus.values)]


def get_run(request, pk: int) -> Run:
    """The run, if it exists and the caller may read it (else 404: not even that it exists)."""
    run = (readable_runs(request.user).select_related("spec", "goal", "requested_by",
                                                     "opened_by", "parent_step")
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
    last_evidence: dict[str, Any] = Field(description="the evidence of its latest report")
    last_state_patch: dict[str, Any] = Field(description="what its latest report merged "
                                                         "into the shared state")
    duration_seconds: float | None = Field(description="its attempt's, to now if running")
    evidence_digest: str = Field(
        "", description="a waiting gate's digest of what its approvers decide on (params, "
                        "shared state, spec version, the gate's spec); send it back as "
                        "`seen` when deciding")
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
    opened_by: str | None = Field(None, description="who opened it for its requester, "
                                                    "when that was someone else")
    idempotency_key: str
    shared_state: dict[str, Any]
    params: dict[str, Any]
    next_action: str
    current_step: str
    error: str
    kind: str
    ref: str
    blocker_reason: str
    last_label: str = Field(description="the label of its latest labelled checkpoint")
    duration_seconds: float = Field(description="from opening to its end, or to now")
    parent: ParentOut | None = Field(None, description="for a child run: the run and step "
                                                       "that opened it and wait for it")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reused_existing: bool = False
    steps: list[StepOut] | None = None
    record_warning: str | None = Field(
        None, description="on GET of one run: what does not verify in its latest record "
                          "(checkpoints and decisions changed behind Tollgate's back), or "
                          "empty; `manage.py verify_audit` checks the whole chain and seals")


class RunPage(Schema):
    count: int
    results: list[RunOut]


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


def run_out(run: Run, *, steps=None, reused: bool = False) -> dict:
    data = {f: getattr(run, f) for f in (
        "id", "title", "status", "priority", "idempotency_key", "shared_state", "params",
        "current_step", "error", "kind", "ref", "blocker_reason", "created_at", "started_at",
        "finished_at", "last_label", "duration_seconds")}
    data.update(spec=run.spec_name, spec_version=run.spec.version, goal=run.goal_id,
                next_action=run.what_next,
                parent={"run": run.parent_step.run_id, "step": run.parent_step.key}
                if run.parent_step_id else None,
                requested_by=run.requested_by.get_username() if run.requested_by else None,
                opened_by=run.opened_by.get_username() if run.opened_by_id else None,
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

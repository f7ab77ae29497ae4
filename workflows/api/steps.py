"""A run's steps: approve, reject, reassign, retry, skip. Every write goes through the
engine."""

from __future__ import annotations

from typing import Any

from ninja import Field, Router
from pydantic import ConfigDict

from tollgate.schemas import SAYS_SOMETHING, Error, Id, Input, Key
from workflows import engine
from workflows.api.schemas import RunOut, fresh_run, get_run
from workflows.models import Channel

router = Router(tags=["workflows"])


class SkipIn(Input):
    reason: str = Field(min_length=1, max_length=500, json_schema_extra=SAYS_SOMETHING)


SEEN = ("required: the gate's evidence_digest as you read it (GET the run), so the record "
        "says what the decision was made on; if what its approvers decide on changed since, "
        "the decision is refused with 409 saying what changed, and nothing is recorded")


class DecisionIn(Input):
    comment: str = Field("", max_length=5000)
    seen: str = Field(min_length=64, max_length=64, pattern="^[0-9a-f]{64}$", description=SEEN)


class RejectIn(Input):
    comment: str = Field(min_length=1, max_length=5000, description="why: required to reject",
                         json_schema_extra=SAYS_SOMETHING)
    seen: str = Field(min_length=64, max_length=64, pattern="^[0-9a-f]{64}$", description=SEEN)


class ApproveIn(DecisionIn):
    values: dict[str, Any] | None = Field(
        None, description="the gate's form (approval.form), filled in: field name: value")


DECIDE = {200: RunOut, 400: Error, 401: Error, 403: Error, 404: Error, 409: Error}


@router.post("/runs/{run_id}/steps/{key}/approve", response=DECIDE,
             summary="Approve a gate (with its form's values, if it has a form)")
def approve(request, run_id: Id, key: Key, payload: ApproveIn):
    engine.approve(get_run(request, run_id), key, user=request.user, comment=payload.comment,
                   values=payload.values, channel=Channel.API, seen=payload.seen)
    return fresh_run(request, run_id)


@router.post("/runs/{run_id}/steps/{key}/reject", response=DECIDE,
          summary="Reject a gate (a comment is required)")
def reject(request, run_id: Id, key: Key, payload: RejectIn):
    engine.reject(get_run(request, run_id), key, user=request.user, comment=payload.comment,
                  channel=Channel.API, seen=payload.seen)
    return fresh_run(request, run_id)


class ReassignIn(Input):
    # Exactly one of group and person names who decides it now.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["group"], "properties": {"group": {"minLength": 1},
                                               "person": {"maxLength": 0}}},
        {"required": ["person"], "properties": {"person": {"minLength": 1},
                                                "group": {"maxLength": 0}}}]})

    reason: str = Field(min_length=1, max_length=500, description="why: required",
                        json_schema_extra=SAYS_SOMETHING)
    group: str = Field("", max_length=150, description="the group that decides it now")
    person: str = Field("", max_length=150, description="or the username that decides it now")
    rule: str = Field("", max_length=200,
                      description="which waiting rule (its label), when the gate waits on several")


@router.post("/runs/{run_id}/steps/{key}/reassign", response=DECIDE,
             summary="Point a waiting gate at another group or person (operators)")
def reassign(request, run_id: Id, key: Key, payload: ReassignIn):
    engine.reassign_gate(get_run(request, run_id), key, actor=request.user,
                         reason=payload.reason, group=payload.group, person=payload.person,
                         rule=payload.rule)
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

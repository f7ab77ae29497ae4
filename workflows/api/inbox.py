"""The caller's inbox: the gates waiting on them, each as they see it (the read model of
`workflows.reads.gates`, as the web inbox shows it)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Query, Router, Schema

from tollgate.query import MAX_ID
from tollgate.schemas import Error
from workflows.reads import gates as gates_seen

router = Router(tags=["workflows"])


class DeadlineOut(Schema):
    at: datetime
    then: str = Field(description="what the gate does then: \"rejects itself\", "
                                  "\"escalates to ops\"")


class GateOut(Schema):
    run: int
    run_title: str
    spec: str
    step: str = Field(description="the gate's key")
    title: str
    attempt: int
    waiting_since: datetime | None
    deadline: DeadlineOut | None
    evidence_digest: str = Field(description="send it back as `seen` when deciding")
    waits_on: str = Field(description="whom it waits on now, in words")
    approvals: int = Field(description="of this attempt, so far")
    required: int
    rule: str = Field(description="the rule the caller's decision would count toward")
    deciding_for: str | None = Field(
        description="the person away the caller would decide it for (null: for themselves)")
    signing: str = Field(description="what signing an approval means (\"\": not signed)")
    page_only: str = Field(
        description="why only its page can decide it (it must be signed, or its form is "
                    "filled in there), \"\" when the API can; the page's address is `url`")
    others: list[str] = Field(description="who else may decide it now")
    url: str = Field(description="the run's page, where the gate is decided in a browser")


class InboxOut(Schema):
    count: int = Field(description="gates waiting on the caller in all (of this view)")
    results: list[GateOut]


@router.get("/inbox", response={200: InboxOut, 400: Error, 401: Error},
            summary="The gates waiting on you, as you see them")
def inbox(request,
          sort: Literal["age", "deadline"] = Query(
              "age", description="longest waiting first, or nearest deadline first"),
          group: str = Query("", max_length=150,
                             description="only gates waiting on this group now"),
          spec: str = Query("", max_length=100),
          goal: int | None = Query(None, ge=1, le=MAX_ID),
          limit: int = Query(50, ge=1, le=200), offset: int = Query(0, ge=0, le=MAX_ID)):
    waiting = gates_seen.waiting_on(request.user, sort=sort, group=group, spec=spec,
                                    goal=goal)
    page = gates_seen.seen_by(request.user, list(waiting.select_related(
        "run", "run__spec", "run__requested_by")[offset:offset + limit]), brief=False)
    return {"count": waiting.count(), "results": [_gate_out(request, gate) for gate in page]}


def _gate_out(request, gate) -> dict:
    return {"run": gate.run_id, "run_title": gate.run.title, "spec": gate.run.spec_name,
            "step": gate.key, "title": gate.title, "attempt": gate.attempt,
            "waiting_since": gate.waiting_since,
            "deadline": {"at": gate.due["at"], "then": gate.due["then"]} if gate.due else None,
            "evidence_digest": gate.evidence_digest, "waits_on": gate.waits_on,
            "approvals": gate.approved, "required": gate.approval_required,
            "rule": gate.deciding_rule.label if gate.deciding_rule else "",
            "deciding_for": gate.deciding_for.name if gate.deciding_for else None,
            "signing": gate.signing, "page_only": gate.page_only, "others": gate.others,
            "url": request.build_absolute_uri(gate.run.get_absolute_url())}

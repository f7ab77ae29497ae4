"""Specs: list, read (inline values masked unless you may change specs), load, archive and
activate."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import Http404
from ninja import Body, Path, Query, Router, Schema, Status
from ninja.errors import HttpError

from tollgate.schemas import Error, Input, WholeId
from workflows.api.schemas import SpecOut, SpecStatusName
from workflows.models import SpecStatus
from workflows.people.permissions import can_change_specs
from workflows.reads import selectors
from workflows.specs.storage import set_spec_status, store_spec
from workflows.specs.validation import SpecError

router = Router(tags=["workflows"])


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
    version: WholeId


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

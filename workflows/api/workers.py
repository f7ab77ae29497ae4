"""The consumers and periodic tasks, for operators."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Router, Schema

from tollgate.schemas import Error
from workflows import engine
from workflows.ops import operations
from workflows.recovery import presence

router = Router(tags=["workflows"])


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

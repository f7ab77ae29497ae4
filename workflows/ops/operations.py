"""What the people running Tollgate look at: the workers seen, the periodic tasks, and
whether this instance is ready (database and queue answer)."""

from __future__ import annotations

from datetime import timedelta

from workflows.models import Compensation, PeriodicRun, Step, Worker
from workflows.recovery.presence import state

WINDOW = timedelta(days=1)  # workers not seen for a day are left off the page


def workers(now) -> list[Worker]:
    """The consumers seen lately, each with its `state` and what it holds (`held`)."""
    found = list(Worker.objects.filter(last_seen__gte=now - WINDOW).order_by(
        "-last_seen")[:500])
    wanted: dict[str, set[int]] = {"step": set(), "compensation": set()}
    for worker in found:
        worker.state = state(worker, now)
        worker.held = []
        for item in worker.holds or []:
            kind, _, pk = str(item).partition(":")
            if kind in wanted and pk.isdigit():
                wanted[kind].add(int(pk))
                worker.held.append({"kind": kind, "id": int(pk)})
    where = {("step", pk): (run, key) for pk, run, key in Step.objects.filter(
        pk__in=wanted["step"]).values_list("pk", "run_id", "key")}
    where |= {("compensation", pk): (run, key) for pk, run, key in
              Compensation.objects.filter(pk__in=wanted["compensation"]).values_list(
                  "pk", "run_id", "step__key")}
    for worker in found:
        for held in worker.held:
            held["run"], held["step"] = where.get((held["kind"], held["id"]), (None, ""))
    return found


def periodic_runs() -> list[PeriodicRun]:
    return list(PeriodicRun.objects.order_by("name"))


def readiness() -> dict[str, str]:
    """{check: "ok" or what failed} for the database and the queue."""
    from django.db import connection
    from huey.contrib.djhuey import HUEY

    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"{type(exc).__name__}: {exc}"[:300]
        connection.close()
    if checks["database"] == "ok":
        checks["schema"] = _schema_state()
    try:
        HUEY.pending_count()
        checks["queue"] = "ok"
    except Exception as exc:
        checks["queue"] = f"{type(exc).__name__}: {exc}"[:300]
    return checks


_schema_current = False  # once current, it stays so for this process's code


def _schema_state() -> str:
    """"ok" when the database has every migration this code knows: a process of a new
    release is not ready before the migration ran (a rolling upgrade, a stack coming up)."""
    global _schema_current
    if _schema_current:
        return "ok"
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    if pending:
        return f"{len(pending)} migration(s) not applied yet: run manage.py migrate"
    _schema_current = True
    return "ok"

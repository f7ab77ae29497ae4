"""Operating Tollgate: the workers page and API with live, killed and frozen consumers, the
periodic tasks' last runs, and /readyz with the database or the queue away."""

from __future__ import annotations

import os
import signal

import pytest
from django.test import Client

from tests.api.conftest import Api
from tests.workflows.consumers import freeze, wait_for
from workflows import engine
from workflows.models import PeriodicRun, Step, Worker
from workflows.recovery import presence
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.mark.consumer
def test_the_workers_page_shows_live_killed_and_frozen_consumers(consumers, settings, people,
                                                                  tmp_path):
    settings.TOLLGATE_SWEEP_SECONDS = 1
    store_spec({"name": "hold", "steps": [{"key": "work", "run": {"shell": "sleep 30"}}]})
    live, killed, frozen = (consumers(workers=1), consumers(workers=1), consumers(workers=1))
    run = engine.open_run("hold").run
    wait_for(lambda: Worker.objects.count() >= 3, 60, what="three consumers to report")
    step = wait_for(lambda: Step.objects.filter(run=run, status="running",
                                                child_pid__isnull=False).first(),
                    60, what="a consumer to hold the step")

    def holder_of_step():
        return next((w for w in Worker.objects.all() if f"step:{step.pk}" in w.holds), None)

    holder = wait_for(holder_of_step, 30, what="its holder to report the step")
    others = [c for c in (live, killed, frozen) if c.pid != holder.pid]
    others[0].kill()
    freeze(others[1].pid)
    try:
        wait_for(lambda: {w.pid: presence.state(w) for w in Worker.objects.all()}.get(
            others[1].pid) == "silent", 30, what="the frozen consumer to fall silent")
        # The frozen one stays silent; the live holder is alive at its next beat (on a busy
        # machine a beat can come late: the states are read until it has come).
        def states():
            return {w.pid: presence.state(w) for w in Worker.objects.all()}

        wait_for(lambda: states()[others[0].pid] == "gone" and states()[holder.pid] == "alive",
                 60, what="the killed consumer gone and the holder alive")
        client = Client()
        client.force_login(people["alice"])  # an operator
        body = client.get("/workers/").content.decode()
        assert f"run {run.pk} work" in body and "silent" in body and "gone" in body
        assert "sweep" in body  # the periodic tasks' last runs

        def holder_as_the_api_says():
            data = Api(people["alice"]).get("/api/workers").json()
            found = next(w for w in data["workers"] if w["pid"] == holder.pid)
            return found if found["state"] == "alive" else None

        mine = wait_for(holder_as_the_api_says, 60, what="the API to show the holder alive")
        assert mine["holds"] == [{"kind": "step", "id": step.pk, "run": run.pk, "step": "work"}]
        assert Api(people["bob"]).get("/api/workers").status_code == 403
    finally:
        os.kill(others[1].pid, signal.SIGCONT)
        engine.cancel_run(run)


def test_a_late_sweeper_is_warned_about(settings):
    from datetime import timedelta

    from django.utils import timezone

    assert "No sweep has run yet" in presence.sweeper_late()
    with presence.periodic("sweep"):
        pass
    assert presence.sweeper_late() == ""
    PeriodicRun.objects.filter(name="sweep").update(
        last_finished=timezone.now() - timedelta(seconds=10 * settings.TOLLGATE_SWEEP_SECONDS))
    assert "No sweep has run since" in presence.sweeper_late()
    with pytest.raises(RuntimeError), presence.periodic("sweep"):
        raise RuntimeError("boom")
    assert PeriodicRun.objects.get(name="sweep").last_error == "RuntimeError: boom"
    assert PeriodicRun.objects.get(name="sweep").runs == 2


def test_readyz_answers_503_when_the_database_or_the_queue_is_away(monkeypatch):
    client = Client()
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {
        "ready": True, "checks": {"database": "ok", "schema": "ok", "queue": "ok"}}
    from huey.contrib.djhuey import HUEY

    def away(*args, **kwargs):
        raise ConnectionError("queue away")

    monkeypatch.setattr(HUEY, "pending_count", away)
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["checks"]["queue"].startswith(
        "ConnectionError")
    assert client.get("/healthz").status_code == 200


def test_readyz_is_503_until_the_database_has_every_migration(monkeypatch):
    """A process of a new release is not ready before the migration ran."""
    from django.db.migrations.executor import MigrationExecutor

    from workflows.ops import operations

    monkeypatch.setattr(operations, "_schema_current", False)
    monkeypatch.setattr(MigrationExecutor, "migration_plan",
                        lambda self, targets: [("workflows", "0099_to_come")])
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["schema"] == ("1 migration(s) not applied yet: run "
                                                   "manage.py migrate")
    monkeypatch.undo()
    assert Client().get("/readyz").status_code == 200


def test_readyz_with_postgresql_and_redis_not_answering(tmp_path):
    """A process whose PostgreSQL and Redis are stopped (nothing answers at their address)
    answers /readyz with 503 naming both, and /healthz with 200."""
    import socket
    import subprocess
    import sys

    from tests.support.processes import ROOT

    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])  # free, so nothing listens there
    script = ("import django; django.setup(); from django.test import Client; "
              "c = Client(); r = c.get('/readyz'); print(r.status_code, r.content.decode()); "
              "print(c.get('/healthz').status_code)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tollgate.settings", "DEBUG": "0",
           "ALLOWED_HOSTS": "testserver",
           "DATABASE_URL": f"postgres://postgres@127.0.0.1:{ports[0]}/tollgate",
           "TOLLGATE_REDIS_URL": f"redis://127.0.0.1:{ports[1]}/0",
           "PGCONNECT_TIMEOUT": "2"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    status, body = done.stdout.splitlines()[0].split(" ", 1)
    import json

    checks = json.loads(body)["checks"]
    assert status == "503" and checks["database"] != "ok" and checks["queue"] != "ok"
    assert "Connection" in checks["queue"] or "Error" in checks["queue"]
    assert done.stdout.splitlines()[1] == "200"


def test_database_url_names_a_primary_and_its_standbys():
    """libpq's several hosts: the process connects to whichever of them takes writes."""
    from tollgate.settings import parse_database_url

    db = parse_database_url("postgres://tollgate:s3cret@db1:5432,db2:6543,db3/tollgate"
                            "?target_session_attrs=read-write&connect_timeout=3")
    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"], db["PASSWORD"]) == (
        "db1,db2,db3", "5432,6543,5432", "tollgate", "tollgate", "s3cret")
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"
    one = parse_database_url("postgres://tollgate@db1:5432/tollgate")
    assert (one["HOST"], one["PORT"]) == ("db1", 5432)

"""Clock steps on the web server and on a sweeping process: a wall clock stepped 217 s forward
or back (an NTP step, a resumed VM) decides no gate early, lets no late decision through,
sends no reminder early and takes back no live lease. (The consumer's own case, its
periodic tasks included, is in tests/workflows/workers/test_live_attempts.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.db import connection

from workflows import engine
from workflows.models import ApiToken, Checkpoint, Step
from workflows.specs.storage import store_spec
from workflows.timing import clock

from ..support.attempts import logged_shell, overlaps
from ..support.processes import ROOT, listener, start_gunicorn, stop, wait_for
from ..workflows.consumers import consumer_env
from .conftest import check_run, injected

pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.consumer,
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="SQLite's clock is each process's own: one machine, one clock"),
]

STEPS = ["217", "-217"]


def gate_spec(name: str):
    return store_spec({"name": name, "steps": [
        {"key": "qa", "approval": {"group": "qa", "timeout_seconds": 120,
                                   "remind_after_seconds": 100}}]})[0]


@pytest.mark.parametrize("step", STEPS)
def test_a_web_server_whose_clock_steps_decides_gates_on_the_databases_clock(
        people, tmp_path, step):
    spec = gate_spec("web-stepped")
    anchor, on_time, late = (engine.open_run(spec, actor=people["alice"]).run
                             for _ in range(3))
    Step.objects.filter(run=late, key="qa").update(
        deadline_at=clock.database_now() - timedelta(seconds=2))  # its deadline task not run
    token = ApiToken.objects.issue(people["bob"])[1]
    offset = tmp_path / "offset"
    offset.write_text("0")
    env = {**consumer_env(), "TOLLGATE_VAR_DIR": str(tmp_path), "ALLOWED_HOSTS": "127.0.0.1",
           "TOLLGATE_SSL_REDIRECT": "0", "TOLLGATE_SECURE_COOKIES": "0",
           "SECRET_KEY": "clock-" + "x" * 50}
    sock = listener()
    port = sock.getsockname()[1]

    def approve(run) -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/runs/{run.pk}/steps/qa/approve",
            data=json.dumps({"seen": run.steps.get(key="qa").evidence_digest}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, ""
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    web = start_gunicorn(env, sock, workers=1, wall_step=str(offset))
    try:
        assert approve(anchor)[0] == 200  # the server has read the database's time
        offset.write_text(step)
        injected()
        time.sleep(0.5)  # the shim reads its file again every 200 ms
        assert approve(on_time)[0] == 200  # 120 s left: not late, whatever its clock says
        status, body = approve(late)
        assert status == 409 and "deadline passed" in body  # 2 s late: refused
    finally:
        stop(web, timeout=5)
    for run in (anchor, on_time):
        assert Step.objects.get(run=run, key="qa").status == "completed"
        assert check_run(run.pk) == []
    assert Step.objects.get(run=late, key="qa").status == "waiting_approval"


@pytest.mark.parametrize("step", STEPS)
def test_a_sweeper_whose_clock_steps_takes_nothing_early(consumers, people, tmp_path, step):
    """The sweeper, deadline and reminder tasks run in a process of their own whose wall
    clock steps, while a healthy consumer holds a live lease and a gate waits with 120 s
    left: no lease taken back, no gate timed out, no reminder sent."""
    log = tmp_path / "attempts.log"
    consumers(workers=1, TOLLGATE_LEASE_SECONDS="3")
    work = store_spec({"name": "swept", "steps": [
        {"key": "work", "max_retries": 2, "run": {"shell": logged_shell(log, 6)}}]})[0]
    running = engine.open_run(work).run
    waiting = engine.open_run(gate_spec("swept-gate"), actor=people["alice"]).run
    wait_for(lambda: Step.objects.filter(run=running, status="running").exists(), 60, 0.05,
             what="the command to start")
    offset = tmp_path / "offset"
    offset.write_text("0")
    from ..support.processes import wallstep

    env = {**consumer_env(), "LD_PRELOAD": wallstep(), "WALLSTEP_FILE": str(offset)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.remote", "sweep",
         json.dumps({"seconds": 3, "offset_file": str(offset), "step": step})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    injected()
    swept = json.loads(done.stdout.splitlines()[-1])
    assert swept["stepped_by"] == int(step)  # its clock did step
    assert (swept["expired"], swept["timed_out"], swept["reminded"]) == (0, 0, 0)
    wait_for(lambda: Step.objects.get(run=running).status == "completed", 60, 0.2,
             what="the command to finish")
    assert Step.objects.get(run=running).attempt == 1 and overlaps(log) == []
    gate = Step.objects.get(run=waiting)
    assert gate.status == "waiting_approval" and gate.reminders_sent == 0
    assert not Checkpoint.objects.filter(
        kind__in=["gate_timed_out", "gate_reminded", "lease_recovered"]).exists()

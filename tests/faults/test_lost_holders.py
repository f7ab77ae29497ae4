"""Claims whose holder is not this machine's live, reachable process: a consumer holding a
batch in a pid namespace of its own (a container) killed mid-batch, and live consumers whose
database is stopped for longer than the lease. The database knows which claims began, so
nothing is charged that never began: every run ends as its policy says (no retries here, so
a run fails only if its one attempt began and was cut short), whoever held the claim."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from django.db import connection

from workflows import engine
from workflows.models import Checkpoint, Run, Step
from workflows.specs.storage import store_spec

from ..support.attempts import logged_shell, overlaps, read
from ..workflows.consumers import wait_for
from .conftest import ANOMALIES, TALLY, check_run, injected

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]

RUNS = 6


def one_step_runs(log, name: str, seconds: float) -> list[int]:
    spec = store_spec({"name": name, "steps": [
        {"key": "work", "max_retries": 0, "run": {"shell": logged_shell(log, seconds)}}]})[0]
    return [engine.open_run(spec).run.pk for _ in range(RUNS)]


def judged(run_ids: list[int], log, what: str) -> dict[str, list]:
    """Wait for every run to end, then sort them: a run failed although none of its attempts
    began is a claim charged that never began; a run whose attempt began and did not end
    may fail (its policy: no retries); every other run completes."""
    for run_id in run_ids:
        wait_for(lambda run_id=run_id: Run.objects.get(pk=run_id).status in (
            "completed", "failed"), 120, 0.25, what=f"run {run_id} to end")
    attempts = read(log)
    charged, wrong = [], []
    for run_id in run_ids:
        tried = attempts.get((str(run_id), "work"), [])
        status = Run.objects.get(pk=run_id).status
        if status == "failed" and not tried:
            charged.append(f"run {run_id} failed ({what}) though its command never began")
        cut_short = any(not attempt["ended"] for attempt in tried)
        wrong += check_run(run_id, ("completed", "failed") if cut_short else ("completed",))
    lapped = overlaps(log)
    TALLY["claims charged that never began"] += len(charged)
    TALLY["overlapping attempts"] += len(lapped)
    ANOMALIES.extend(charged + lapped)
    released = Checkpoint.objects.filter(run_id__in=run_ids, kind="step_released").count()
    print(f"\n{what}: {released} claim(s) given back unspent, {len(charged)} charged")
    return {"charged": charged, "wrong": wrong, "overlapping": lapped, "released": released}


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace of its own needs root")
def test_a_batch_holder_in_another_pid_namespace_killed_charges_only_what_began(consumers,
                                                                               tmp_path):
    log = tmp_path / "attempts.log"
    env = {"TOLLGATE_SPOOL_DIR": str(tmp_path / "spool"), "TOLLGATE_GROUP_COMMIT_STEPS": "8"}
    # Long commands: the first is still running when the test looks, however busy the machine.
    run_ids = one_step_runs(log, "batch-in-a-box", 10)
    box = consumers(workers=1, container="box", **env)  # claims all six in one batch
    wait_for(lambda: Step.objects.filter(run_id__in=run_ids, status="running").count()
             == RUNS and read(log), 60, 0.05, what="the container to claim the batch and begin")
    assert Step.objects.filter(run_id__in=run_ids, began_at__isnull=True).count() == RUNS - 1
    box.kill()
    injected()
    consumers(workers=2, **env)
    found = judged(run_ids, log, "a batch holder in another pid namespace killed")
    assert found["released"] == RUNS - 1
    assert found["charged"] == found["wrong"] == found["overlapping"] == []


@pytest.mark.serial  # every parallel worker's database is on the server it stops
@pytest.mark.skipif(connection.vendor != "postgresql" or not shutil.which("pg_ctlcluster"),
                    reason="stops the PostgreSQL server")
def test_live_consumers_whose_database_stops_past_the_lease_charge_only_what_began(
        consumers, tmp_path):
    log = tmp_path / "attempts.log"
    env = {"TOLLGATE_SPOOL_DIR": str(tmp_path / "spool"), "TOLLGATE_GROUP_COMMIT_STEPS": "8",
           "TOLLGATE_LEASE_SECONDS": "3"}
    run_ids = one_step_runs(log, "outage", 2)
    consumers(workers=1, **env)
    wait_for(lambda: read(log), 60, 0.05, what="the batch's first command to begin")
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    cluster = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main"]
    subprocess.run([*cluster, "stop", "-m", "fast"], check=True, timeout=60,
                   capture_output=True)
    try:
        time.sleep(6)  # twice the lease: the consumer lets go of every claim it holds
    finally:
        subprocess.run([*cluster, "start"], check=True, timeout=60, capture_output=True)
    injected()
    connection.close()  # ours died with the server
    found = judged(run_ids, log, "the database stopped past the lease")
    assert found["charged"] == found["wrong"] == found["overlapping"] == []
    let_go = Checkpoint.objects.filter(run_id__in=run_ids, kind="step_failed",
                                       summary__contains="gone")
    assert not let_go.exists(), [c.summary for c in let_go]

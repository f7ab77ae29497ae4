"""A network partition: a worker host (a network namespace of its own, reaching PostgreSQL and
Redis over a link) is cut off while its command runs, for longer than the lease, then healed.
Its command is stopped when its lease runs out unrenewed, a consumer on this side takes the
step over, the cut-off attempt's report is refused by its lease token, and nothing is stuck."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection

from workflows import engine
from workflows.models import Checkpoint, Run, Step
from workflows.specs.storage import store_spec

from ..support import netns
from ..support.attempts import logged_shell, overlaps, read
from ..workflows.consumers import database_url, wait_for
from .conftest import ANOMALIES, TALLY, check_run, injected

pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.consumer,
    pytest.mark.skipif(connection.vendor != "postgresql" or not netns.available(),
                       reason="a host cut off from PostgreSQL by a network namespace (root)"),
]

PARTITIONS = int(os.environ.get("TOLLGATE_PARTITIONS", "4"))
HOST = "cut-off-host"


@pytest.fixture
def worker_host():
    host = netns.WorkerHost(1)
    yield host
    host.close()


def reached_from(host: netns.WorkerHost, url: str) -> str:
    """`url` with its server's address replaced by the one that reaches it from `host`."""
    parts = urlsplit(url)
    address, port = host.reach(parts.hostname, parts.port)
    auth = parts.netloc.rpartition("@")[0]
    return parts._replace(netloc=f"{auth}@{address}:{port}" if auth else f"{address}:{port}"
                          ).geturl()


def test_worker_host_cut_off_longer_than_its_lease(consumers, worker_host, tmp_path, settings):
    log = tmp_path / "attempts.log"
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    env = {"TOLLGATE_SPOOL_DIR": settings.TOLLGATE_SPOOL_DIR, "TOLLGATE_LEASE_SECONDS": "2"}
    spec = store_spec({"name": "partition", "steps": [
        {"key": "work", "max_retries": 5, "run": {"shell": logged_shell(log, 4)}}]})[0]
    # A host of its own has a disk of its own: this side cannot read what its spool holds.
    remote_env = {**env, "DATABASE_URL": reached_from(worker_host, database_url()),
                  "TOLLGATE_SPOOL_DIR": str(tmp_path / "cut-off-spool")}
    if django_settings.HUEY["huey_class"] != "huey.SqliteHuey":
        remote_env["TOLLGATE_REDIS_URL"] = reached_from(worker_host, django_settings.HUEY["url"])
    consumers(workers=2, netns=worker_host.name, container=HOST, **remote_env)
    local = consumers(workers=2, **env)
    runs = []
    for _ in range(PARTITIONS):
        # This side's consumer is paused until the cut-off host holds the step.
        os.kill(local.pid, signal.SIGSTOP)
        try:
            run = engine.open_run(spec).run
            runs.append(run.pk)
            wait_for(lambda run=run: Step.objects.filter(
                run=run, status="running", holder_host=HOST).exists(),
                60, 0.05, what="the cut-off host to start the step")
        finally:
            os.kill(local.pid, signal.SIGCONT)
        time.sleep(0.5)  # its command is running
        worker_host.cut()
        injected()
        try:
            # Cut off for longer than the lease: this side takes the step over.
            wait_for(lambda run=run: Step.objects.filter(run=run, attempt__gt=1).exclude(
                holder_host=HOST).exists(), 60, 0.1, what="this side to take the step over")
            time.sleep(1.0)
        finally:
            worker_host.heal()
    stuck = []
    for run_id in runs:
        try:
            wait_for(lambda run_id=run_id: Run.objects.get(pk=run_id).status == "completed",
                     120, 0.25, what=f"run {run_id} to complete")
        except AssertionError:
            stuck.append(run_id)
    # The cut-off host comes back and reports its fenced attempt: refused by its token.
    wait_for(lambda: Checkpoint.objects.filter(run_id__in=runs, kind="stale_result").count()
             >= len(runs), 60, 0.25, what="the cut-off attempts' reports to be refused")
    lapped = overlaps(log)
    attempts = read(log)
    TALLY["overlapping attempts"] += len(lapped)
    TALLY["steps stuck"] += len(stuck)
    ANOMALIES.extend(lapped + [f"run {run_id} stuck after a partition" for run_id in stuck])
    anomalies = [found for run_id in runs for found in check_run(run_id)]
    assert lapped == [] and stuck == [] and anomalies == [], (lapped, stuck, anomalies)
    for run_id in runs:
        step = Step.objects.get(run_id=run_id)
        # One attempt on each side of the cut, the first stopped before its end.
        tried = attempts[(str(run_id), "work")]
        assert len(tried) == step.attempt >= 2 and not tried[0]["ended"] and tried[-1]["ended"]


def test_a_command_that_finishes_during_a_long_cut_runs_again_as_the_readme_says(
        consumers, worker_host, tmp_path, settings):
    """The one case where a command on a host that survives runs twice, exactly as the
    README says: the host is cut off, its command runs to its end (exit 0) during the cut,
    and the cut outlasts the lease plus the kill grace, so this side runs the step again.
    The cut also outlasts the report window, and still nothing vanishes: when the host comes
    back its result is recorded as a stale result with its exit code and output digest."""
    log = tmp_path / "attempts.log"
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    # A lease long enough that the command (5 s: the cut comes long before its end, however
    # busy the machine) ends well before its fence would stop it.
    env = {"TOLLGATE_SPOOL_DIR": settings.TOLLGATE_SPOOL_DIR, "TOLLGATE_LEASE_SECONDS": "10"}
    spec = store_spec({"name": "finished-in-the-cut", "steps": [
        {"key": "work", "max_retries": 5,
         "run": {"shell": logged_shell(log, 5) + "; echo shipped"}}]})[0]
    remote_env = {**env, "DATABASE_URL": reached_from(worker_host, database_url()),
                  "TOLLGATE_SPOOL_DIR": str(tmp_path / "cut-off-spool"),
                  "TOLLGATE_REPORT_RETRY_SECONDS": "3",
                  "TOLLGATE_PG_TCP_USER_TIMEOUT_SECONDS": "2"}
    if django_settings.HUEY["huey_class"] != "huey.SqliteHuey":
        remote_env["TOLLGATE_REDIS_URL"] = reached_from(worker_host, django_settings.HUEY["url"])
    consumers(workers=2, netns=worker_host.name, container=HOST, **remote_env)
    local = consumers(workers=2, **env)
    os.kill(local.pid, signal.SIGSTOP)
    try:
        run = engine.open_run(spec).run
        wait_for(lambda: read(log).get((str(run.pk), "work")), 60, 0.02,
                 what="the cut-off host's command to begin")
        worker_host.cut()  # as its command begins, long before its end and its report
        injected()
    finally:
        os.kill(local.pid, signal.SIGCONT)
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", 120, 0.25,
                 what="this side to run the step again and complete it")
        first = read(log)[(str(run.pk), "work")][0]
        assert first["ended"], "the command ran to its end on the cut-off host"
        time.sleep(4)  # past the report window (3 s) on the cut-off host
    finally:
        worker_host.heal()
    stale = wait_for(lambda: Checkpoint.objects.filter(run=run, kind="stale_result").first(),
                     120, 0.25, what="the cut-off host's result to be recorded as stale")
    tried = read(log)[(str(run.pk), "work")]
    twice = sum(attempt["ended"] for attempt in tried) - 1
    TALLY["finished commands run again after a partition"] += twice
    vanished = 0 if stale.evidence.get("exit_code") == 0 else 1
    TALLY["results vanished without a stale result"] += vanished
    assert twice == 1 and vanished == 0, (tried, stale.evidence)
    assert stale.evidence["output_sha256"] == hashlib.sha256(b"shipped\n").hexdigest()
    assert overlaps(log) == [] and check_run(run.pk) == []

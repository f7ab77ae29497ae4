"""A fault campaign: many runs of command steps on two consumers while faults rain on them.

Faults: consumers killed with SIGKILL at random points (mid-step and mid-compensation),
consumers frozen with SIGSTOP for longer than the lease, database connections cut
(PostgreSQL), commands that ignore SIGTERM, commands that leave a grandchild behind, and specs
with extreme numbers. Every command step logs its attempt's start, ticks and end, so the
campaign checks what a user would: no two attempts of a step alive at once, no step completed
twice, no successful result thrown away, every compensation run to its end exactly once,
gapless checkpoints, and every run ended as its policy says.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from workflows import engine
from workflows.engine import processes
from workflows.models import Checkpoint, Compensation, Notification, OutboxMessage, Run, Step
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError
from workflows.workers.spool import root as spool_root

from ..support.attempts import logged_shell, overlaps, ran_to_the_end
from ..workflows.consumers import wait_for
from .conftest import ANOMALIES, TALLY, check_run, injected

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]

ON_POSTGRES = connection.vendor == "postgresql"
# PostgreSQL + Redis is the production topology: the long campaign runs there.
FAULTS = int(os.environ.get("TOLLGATE_FAULTS", "300" if ON_POSTGRES else "100"))


def specs(log, undo_log, tmp_path):
    good = store_spec({"name": "campaign", "steps": [
        {"key": "build", "max_retries": 20, "run": {"shell": logged_shell(log, 0.6)}},
        {"key": "test", "depends_on": ["build"], "max_retries": 20,
         "run": {"shell": logged_shell(log, 0.4) + "; (sleep 30 &) ; true"}},
        {"key": "package", "depends_on": ["build"], "max_retries": 20,
         "run": {"callable": "workflows.callables.noop"}},
        {"key": "ship", "depends_on": ["test", "package"], "max_retries": 20,
         "run": {"shell": logged_shell(log, 0.3)}},
    ]})[0]
    doomed = store_spec({"name": "doomed", "steps": [
        {"key": "deploy", "max_retries": 20, "run": {"shell": logged_shell(log, 0.3)},
         "compensation": {"shell": logged_shell(undo_log, 1.5)}},
        {"key": "stubborn", "depends_on": ["deploy"],
         "run": {"shell": "trap '' TERM; while :; do sleep 0.1; done", "timeout_seconds": 1}},
    ]})[0]
    return good, doomed


AS_ROOT = os.geteuid() == 0


class Injector:
    def __init__(self, consumers, rng: random.Random, spool: Path):
        self.spool = spool
        env = {"TOLLGATE_SPOOL_DIR": str(spool), "TOLLGATE_NOTIFY": "1"}
        self.start = lambda container="": consumers(workers=2, container=container, **env)
        # As root, one consumer runs as in a container of its own (pid and UTS namespaces):
        # its steps are remote to the other and to this process.
        self.pool = [self.start(), self.start("box" if AS_ROOT else "")]
        self.rng = rng
        self.counts: dict[str, int] = {}

    def replace(self, index: int) -> None:
        self.pool[index].kill()
        self.pool[index] = self.start("box" if AS_ROOT and index == 1 else "")

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        injected()

    def kill(self) -> None:
        self.replace(self.rng.randrange(len(self.pool)))
        self.count("kill -9 consumer")

    def holder_index(self, row) -> int | None:
        for index, consumer in enumerate(self.pool):
            if row is not None and row.holder_started == processes.start_time(consumer.pid):
                return index
        return None

    def kill_compensating(self) -> bool:
        row = Compensation.objects.filter(status="running").exclude(holder_pid=None).first()
        index = self.holder_index(row)
        if index is None:
            return False
        self.replace(index)
        self.count("kill -9 consumer mid-compensation")
        return True

    def kill_after_exit(self) -> None:
        """Freeze the holder of a running command, let the command finish and its result
        reach the spool, then kill -9 the holder before it could record it."""
        step = Step.objects.filter(status="running").exclude(child_pid=None).first()
        index = self.holder_index(step)
        if index is None:
            return self.kill()
        os.kill(self.pool[index].pid, signal.SIGSTOP)
        folder = spool_root() / f"step-{step.pk}-{step.lease_token}"
        deadline = time.monotonic() + 3
        while not (folder / "result.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.replace(index)
        # The container's consumer comes back as `docker restart` brings it: the same host
        # name and spool, a new pid namespace.
        self.count("container restarted after its command exited" if AS_ROOT and index == 1
                   else "kill -9 consumer after its command exited")

    def freeze(self) -> None:
        consumer = self.pool[self.rng.randrange(len(self.pool))]
        os.kill(consumer.pid, signal.SIGSTOP)
        threading.Timer(3.0, lambda: _cont(consumer.pid)).start()  # lease is 2 s
        self.count("SIGSTOP consumer past its lease" + (" (in a container)"
                                                        if consumer is self.pool[1] and AS_ROOT
                                                        else ""))

    def cut_connections(self) -> None:
        name = connection.settings_dict["NAME"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        self.count("pg_terminate_backend consumers")

    def extreme_spec(self) -> None:
        with pytest.raises(SpecError):
            store_spec({"name": "extreme", "steps": [
                {"key": "a", "retry_backoff_seconds": 1e300, "run": {"command": ["true"]}}]})
        self.count("spec with extreme numbers")


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def api_client():
    """An API client with a token, to count what the API answers while faults rain."""
    from django.test import Client

    from workflows.models import ApiToken

    from ..conftest import make_user

    user = make_user("campaign", perms=("add_run",))
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.objects.issue(user, 'c')[1]}",
                  raise_request_exception=False)


def test_fault_campaign(consumers, tmp_path, settings):
    log, undo_log = tmp_path / "attempts.log", tmp_path / "undo.log"
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    good, doomed = specs(log, undo_log, tmp_path)
    rng = random.Random(int(os.environ.get("TOLLGATE_FAULT_SEED", "11")))
    injector = Injector(consumers, rng, tmp_path / "spool")
    api = api_client()
    faults = [injector.kill] * 3 + [injector.kill_after_exit] * 2 + [injector.freeze] * 2 + [
        injector.extreme_spec]
    if ON_POSTGRES:
        faults += [injector.cut_connections] * 2
    runs: list[tuple[int, str]] = []
    started = injected_before = TALLY["faults injected"]
    deadline = time.monotonic() + 420
    while TALLY["faults injected"] - injected_before < FAULTS and time.monotonic() < deadline:
        if len(runs) < FAULTS // 2:
            spec, policy = (doomed, "failed") if rng.random() < 0.25 else (good, "completed")
            runs.append((engine.open_run(spec).run.pk, policy))
            if policy == "failed":
                injected()  # a command that ignores SIGTERM
            else:
                injected()  # a command that leaves a grandchild holding its output
        if not injector.kill_compensating():
            rng.choice(faults)()
        answers = [api.get(f"/api/runs/{runs[-1][0]}"),
                   api.post("/api/runs", {"spec": "campaign", "idempotency_key": "api-probe"},
                            content_type="application/json")]
        TALLY["HTTP 500s"] += sum(answer.status_code >= 500 and answer.status_code != 503
                                  for answer in answers)
        time.sleep(rng.uniform(0.2, 0.6))
    assert TALLY["faults injected"] - started >= FAULTS, injector.counts
    stuck = []
    for run_id, _ in runs:
        try:
            wait_for(lambda run_id=run_id: Run.objects.get(pk=run_id).status in (
                "completed", "failed", "cancelled") and not Compensation.objects.filter(
                run_id=run_id, status__in=["pending", "running"]).exists(), 180, 0.25,
                what=f"run {run_id} to end")
        except AssertionError:
            steps = list(Step.objects.filter(run_id=run_id).values_list("key", "status"))
            stuck.append(f"run {run_id} stuck: {steps}")
    TALLY["steps stuck"] += len(stuck)
    # Mail owed by failed runs is written in their transitions and delivered from the outbox.
    try:
        wait_for(lambda: not OutboxMessage.objects.filter(done_at=None).exists(), 60, 0.5,
                 what="the outbox to be delivered")
    except AssertionError:
        pass
    unsent = OutboxMessage.objects.filter(done_at=None).count()
    # Each mail is a row of its own, sent and retried until the mail server takes it.
    unsent += Notification.objects.filter(sent_at=None).count()
    TALLY["mails and webhooks lost"] += unsent
    anomalies, undo_anomalies = [], []
    for run_id, policy in runs:
        anomalies += check_run(run_id, (policy,))
    lapped = overlaps(log) + overlaps(undo_log)
    lost = list(Checkpoint.objects.filter(run_id__in=[r for r, _ in runs], kind="stale_result",
                                          summary__contains="completed result"))
    undone = ran_to_the_end(undo_log)
    TALLY["compensations run twice"] += sum(1 for count in undone.values() if count > 1)
    for run_id, policy in runs:
        if policy == "failed":
            if undone.get((str(run_id), "deploy")) != 1:
                undo_anomalies.append(f"run {run_id}: compensation ran to its end "
                                 f"{undone.get((str(run_id), 'deploy'), 0)} times")
            if Step.objects.get(run_id=run_id, key="deploy").status != "compensated":
                undo_anomalies.append(f"run {run_id}: deploy not compensated")
    TALLY["overlapping attempts"] += len(lapped)
    TALLY["results lost"] += len(lost)
    TALLY["anomalies found"] += len(undo_anomalies)
    ANOMALIES.extend(lapped + [f"lost: {c.summary}" for c in lost] + undo_anomalies)
    ANOMALIES.extend(stuck + ([f"{unsent} outbox message(s) not delivered"] if unsent else []))
    # Consumers in containers on one node (each pid 1 in its own namespace) share the metrics
    # folder: every consumer still runs, and /metrics adds them up.
    alive = [consumer.proc.poll() is None for consumer in injector.pool]
    from django.test import Client

    scrape = Client().get("/metrics")  # from loopback, as a local Prometheus scrapes
    ANOMALIES.extend([f"{alive.count(False)} consumer(s) died"] if not all(alive) else [])
    ANOMALIES.extend([f"/metrics answered {scrape.status_code}"]
                     if scrape.status_code != 200 else [])
    print(f"\ncampaign: {injector.counts}, runs {len(runs)}")
    assert lapped == [] and lost == [] and anomalies + undo_anomalies == [], (
        lapped, lost, anomalies, undo_anomalies)
    assert stuck == [] and unsent == 0 and TALLY["HTTP 500s"] == 0
    assert all(alive) and scrape.status_code == 200
    assert b'tollgate_steps_total{' in scrape.content

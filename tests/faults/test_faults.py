"""Faults under load: SIGKILLed consumers, dropped connections, a restarted Redis, a full disk,
a command that ignores SIGTERM. After each, every run ends as its policy says."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import OperationalError, connection

from workflows import engine
from workflows.models import Run, Step
from workflows.recovery import sweeper
from workflows.specs.storage import store_spec
from workflows.workers import worker

from ..workflows.consumers import wait_for
from .conftest import check_run, injected

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]


def chain_spec(name: str, steps: int, callable_: str = "tests.callables.nap", **extra):
    return store_spec({"name": name, "steps": [
        {"key": f"s{i}", "max_retries": 5, "run": {"callable": callable_},
         **({"depends_on": [f"s{i - 1}"]} if i and extra.get("chain") else {})}
        for i in range(steps)]})[0]


def finished(run_id: int) -> bool:
    return Run.objects.get(pk=run_id).status in ("completed", "failed", "cancelled")


def wait_finished(run_id: int, timeout: float) -> None:
    """Wait for the run to close; on timeout, say where it stood."""
    from django.db.models import Count

    try:
        wait_for(lambda: finished(run_id), timeout, 0.25, what=f"run {run_id} to finish")
    except AssertionError as exc:
        run = Run.objects.get(pk=run_id)
        counts = dict(Step.objects.filter(run=run).values_list("status")
                      .annotate(n=Count("pk")).order_by())
        stuck = list(Step.objects.filter(run=run).exclude(status="completed").values(
            "key", "status", "attempt", "lease_expires_at", "retry_after", "rung_at")[:5])
        raise AssertionError(f"{exc}: run {run.status}, updated {run.updated_at}, "
                             f"steps {counts}, e.g. {stuck}") from None


def test_sigkill_consumers_at_random_points_of_a_200_step_run(consumers):
    spec = chain_spec("kill200", 200)
    run = engine.open_run(spec, shared_state={"nap": 0.05}).run
    current = consumers(workers=2)
    rng = random.Random(int(os.environ.get("TOLLGATE_FAULT_SEED", "7")))
    for _ in range(4):
        time.sleep(rng.uniform(0.5, 2.5))
        if finished(run.pk):
            break
        current.kill()
        injected()
        current = consumers(workers=2)
    wait_finished(run.pk, 120)
    assert check_run(run.pk) == []
    assert Step.objects.filter(run=run, status="completed").count() == 200


@pytest.mark.skipif(connection.vendor != "postgresql", reason="kills PostgreSQL backends")
def test_database_connections_dropped_mid_run(consumers):
    spec = chain_spec("dropdb", 60)
    run = engine.open_run(spec, shared_state={"nap": 0.05}).run
    consumers(workers=2)
    name = connection.settings_dict["NAME"]
    for _ in range(3):
        time.sleep(1.0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            dropped = cursor.rowcount
        injected()
        assert dropped >= 0
    wait_finished(run.pk, 120)
    assert check_run(run.pk) == []


def test_connection_lost_inside_a_transition_changes_nothing(release_spec):
    """A transition whose connection dies before commit leaves no partial write behind."""
    run = engine.open_run(release_spec).run
    engine.start_step(run, "build")

    def drop_on_checkpoint(execute, sql, params, many, context):
        if "INSERT INTO" in sql and "workflows_checkpoint" in sql:
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(drop_on_checkpoint), pytest.raises(OperationalError):
        engine.complete_step(run, "build", state_patch={"half": "written"})
    injected()
    run.refresh_from_db()
    assert run.shared_state == {} and run.steps.get(key="build").status == "running"
    engine.complete_step(run, "build")
    engine.cancel_run(run)
    assert check_run(run.pk, ("cancelled",)) == []


def test_disk_full_during_a_step_is_recovered_after_space_returns(settings):
    """SQLITE_FULL (or any write error) while reporting: the lease runs out, the sweeper
    retries the step, and the run completes once writes work again."""
    settings.TOLLGATE_LEASE_SECONDS = 0.5
    spec = chain_spec("diskfull", 3, "workflows.callables.noop", chain=True)
    run = engine.open_run(spec).run
    first = Step.objects.get(run=run, key="s0")

    def disk_full(execute, sql, params, many, context):
        if re.search(r'(INSERT INTO|UPDATE) "?workflows_checkpoint', sql):
            raise OperationalError("database or disk is full")
        return execute(sql, params, many, context)

    # The claim succeeds; the completion cannot be written.
    engine.start_step(run, "s0", owner="w-full", lease_seconds=0.5)
    with connection.execute_wrapper(disk_full), pytest.raises(OperationalError):
        engine.complete_step(run, "s0", lease_token=Step.objects.get(pk=first.pk).lease_token)
    injected()
    time.sleep(0.6)
    assert sweeper.sweep().expired == 1  # space is back: the sweeper takes over
    Step.objects.filter(run=run, status="retrying").update(retry_after=None)
    for _ in range(10):
        for step in Step.objects.filter(run=run, status__in=["pending", "retrying"]):
            worker.run_step(step.pk)
        if finished(run.pk):
            break
    assert check_run(run.pk) == []


@pytest.fixture
def private_redis(tmp_path):
    """A Redis server of this test's own, so restarting it disturbs nobody else."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def start():
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                 "", "--appendonly", "no", "--dir", str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _pings(port), 10, 0.05, what="redis to start")
        return proc

    server = {"proc": start()}

    def stop():
        server["proc"].kill()
        server["proc"].wait()

    def restart():
        stop()
        time.sleep(0.5)
        server["proc"] = start()

    yield SimpleNamespace(url=f"redis://127.0.0.1:{port}/0", restart=restart, stop=stop,
                          start=lambda: server.update(proc=start()))
    stop()


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_redis_restarted_during_a_run(settings, private_redis, tmp_path):
    """The queue loses everything it held; the database still knows, and the sweeper re-rings."""
    from huey import PriorityRedisHuey

    from tests.workflows.consumers import Consumer

    url, restart = private_redis.url, private_redis.restart
    settings.TOLLGATE_DISPATCH = True
    settings.TOLLGATE_CALLABLES = ["workflows.callables.*", "tests.callables.*"]
    name = f"tollgate-fault-{os.getpid()}"
    queue = PriorityRedisHuey(name, url=url)
    import workflows.tasks as tasks

    original = tasks.work.huey
    tasks.work.huey = queue  # this process rings the private Redis too
    consumer = Consumer(workers=2, log=tmp_path / "consumer.log", TOLLGATE_REDIS_URL=url,
                        TOLLGATE_HUEY_NAME=name)
    try:
        spec = chain_spec("redis", 40)
        run = engine.open_run(spec, shared_state={"nap": 0.1}).run
        time.sleep(1.0)
        restart()
        injected()
        wait_for(lambda: finished(run.pk), 120, 0.25, what="the run to finish after the restart")
    finally:
        consumer.stop()
        tasks.work.huey = original
    assert check_run(run.pk) == []


def test_command_ignoring_sigterm_is_killed_and_fails_as_policy_says(consumers, tmp_path):
    pid_file = tmp_path / "pid"
    spec = store_spec({"name": "stubborn", "steps": [
        {"key": "hang", "run": {"shell": f"trap '' TERM; echo $$ > {pid_file}; "
                                         "while :; do sleep 0.2; done", "timeout_seconds": 1}},
        {"key": "never", "depends_on": ["hang"], "run": {"command": ["true"]}},
    ]})[0]
    consumers(workers=1)
    run = engine.open_run(spec).run
    injected()
    wait_for(lambda: finished(run.pk), 30, 0.1, what="the stubborn step to be stopped")
    assert check_run(run.pk, ("failed",)) == []
    hang = Step.objects.get(run=run, key="hang")
    assert hang.status == "failed" and hang.last_evidence.get("timed_out")
    pid = int(pid_file.read_text())
    stat = Path(f"/proc/{pid}/stat")
    wait_for(lambda: not stat.exists() or stat.read_text().split()[2] == "Z", 5,
             what="the process to die")


def test_redis_down_when_a_run_fails_compensation_still_runs(settings, private_redis, tmp_path):
    """The compensation is a row written with the failure, not a message: when the queue is
    down as the run fails, the sweeper rings it once the queue is back."""
    from huey import PriorityRedisHuey

    import workflows.tasks as tasks
    from tests.workflows.consumers import Consumer
    from workflows.models import Compensation

    url = private_redis.url
    settings.TOLLGATE_DISPATCH = True
    name = f"tollgate-undo-{os.getpid()}"
    queue = PriorityRedisHuey(name, url=url)
    original = tasks.compensate_run.huey, tasks.work.huey
    tasks.compensate_run.huey = tasks.work.huey = queue
    undo_log = tmp_path / "undo.log"
    spec = store_spec({"name": "undo-redis", "steps": [
        {"key": "deploy", "run": {"callable": "workflows.callables.noop"},
         "compensation": {"shell": f"echo undone >> {undo_log}"}},
        {"key": "verify", "depends_on": ["deploy"], "run": {"command": ["false"]}}]})[0]
    run = engine.open_run(spec).run
    engine.start_step(run, "deploy")
    engine.complete_step(run, "deploy")
    engine.start_step(run, "verify")
    consumer = None
    try:
        private_redis.stop()
        engine.fail_step(run, "verify", summary="smoke test failed", retryable=False)
        injected()
        assert Compensation.objects.filter(run=run, status="pending").count() == 1
        private_redis.start()
        consumer = Consumer(workers=1, log=tmp_path / "consumer.log", TOLLGATE_REDIS_URL=url,
                            TOLLGATE_HUEY_NAME=name)
        wait_for(lambda: Compensation.objects.filter(run=run, status="done").exists(), 30,
                 what="the compensation to run after the queue returned")
    finally:
        if consumer:
            consumer.stop()
        tasks.compensate_run.huey, tasks.work.huey = original
    assert undo_log.read_text() == "undone\n"
    assert check_run(run.pk, ("failed",)) == []


def test_redis_down_while_gates_open_loses_no_mail(settings, private_redis, tmp_path, people,
                                                  release_spec):
    """Mail a transition owes is an outbox row written with it: gates that open while the
    queue is down are announced once it is back, each to each approver once."""
    from huey import PriorityRedisHuey

    import workflows.tasks as tasks
    from tests.workflows.consumers import Consumer
    from tests.workflows.helpers import work
    from workflows.models import Notification, OutboxMessage

    from .conftest import TALLY

    url = private_redis.url
    settings.TOLLGATE_NOTIFY = True
    name = f"tollgate-outbox-{os.getpid()}"
    queue = PriorityRedisHuey(name, url=url)
    original = tasks.deliver_outbox.huey
    tasks.deliver_outbox.huey = queue
    consumer = None
    try:
        runs = [engine.open_run(release_spec, actor=people["alice"]).run for _ in range(3)]
        private_redis.stop()
        for run in runs:
            work(run, "build")  # its gate opens; the doorbell for the mail cannot be rung
            injected()
        assert OutboxMessage.objects.filter(done_at=None).count() == 3
        private_redis.start()
        consumer = Consumer(workers=1, log=tmp_path / "consumer.log", TOLLGATE_REDIS_URL=url,
                            TOLLGATE_HUEY_NAME=name, TOLLGATE_NOTIFY="1")
        try:
            wait_for(lambda: not OutboxMessage.objects.filter(done_at=None).exists(), 30,
                     what="the outbox to be delivered after the queue returned")
        finally:
            TALLY["mails and webhooks lost"] += OutboxMessage.objects.filter(
                done_at=None).count()
    finally:
        if consumer:
            consumer.stop()
        tasks.deliver_outbox.huey = original
    sent = Notification.objects.filter(event="gate_waiting", sent_at__isnull=False)
    assert sorted(sent.values_list("user__username", flat=True)) == ["bob"] * 3 + ["carol"] * 3


@pytest.mark.serial  # every parallel worker's database is on the server it restarts
@pytest.mark.skipif(connection.vendor != "postgresql" or not shutil.which("pg_ctlcluster"),
                    reason="restarts the PostgreSQL server")
def test_postgresql_restarted_mid_step_keeps_the_result(consumers, tmp_path):
    from ..support.attempts import logged_shell, overlaps

    log = tmp_path / "attempts.log"
    spec = store_spec({"name": "pg-restart", "steps": [
        {"key": "work", "max_retries": 3, "run": {"shell": logged_shell(log, 4)}}]})[0]
    consumers(workers=2, TOLLGATE_LEASE_SECONDS="10")
    run = engine.open_run(spec).run
    wait_for(lambda: Step.objects.filter(run=run, status="running").exists(), 20, 0.05,
             what="the step to start")
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart",
                    "-m", "fast"], check=True, timeout=60, capture_output=True)
    injected()
    connection.close()  # ours died with the server too
    wait_for(lambda: finished(run.pk), 60, 0.25, what="the run to finish after the restart")
    step = Step.objects.get(run=run)
    assert step.status == "completed" and step.attempt == 1  # the result was kept
    assert overlaps(log) == [] and check_run(run.pk) == []


def test_web_server_killed_mid_approve_records_each_decision_once(people, tmp_path, settings):
    """gunicorn is killed with SIGKILL while approvals are in flight; clients retry after it
    comes back. Each approver's decision is recorded once, and the gate passes once."""
    import urllib.error
    import urllib.request

    from workflows.models import ApiToken, Approval

    from ..support.processes import listener, start_gunicorn
    from ..workflows.consumers import consumer_env

    spec = store_spec({"name": "web-kill", "steps": [
        {"key": "qa", "approval": {"group": "qa", "required": 2}}]})[0]
    runs = [engine.open_run(spec, actor=people["alice"]).run for _ in range(20)]
    tokens = {name: ApiToken.objects.issue(people[name])[1] for name in ("bob", "carol")}
    env = {**consumer_env(), "TOLLGATE_VAR_DIR": str(tmp_path), "ALLOWED_HOSTS": "127.0.0.1",
           "TOLLGATE_SSL_REDIRECT": "0", "TOLLGATE_SECURE_COOKIES": "0",
           "SECRET_KEY": "fault-" + "x" * 50}
    sock = listener()
    port = sock.getsockname()[1]

    def approve(run_id: int, name: str, timeout: float = 5):
        # As a client decides: with the gate's evidence digest, read from the run (here
        # from the database: the server may be the one killed).
        seen = Step.objects.get(run_id=run_id, key="qa").evidence_digest
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/runs/{run_id}/steps/qa/approve",
            data=json.dumps({"seen": seen}).encode(),
            headers={"Authorization": f"Bearer {tokens[name]}",
                     "Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None  # the server died under us

    web = start_gunicorn(env, sock)
    answers, down = [], threading.Event()
    # While the server is down the client gives up at once (the port stays bound here, so a
    # request would wait in its backlog rather than be refused): it retries afterwards.
    worker = threading.Thread(target=lambda: answers.extend(
        None if down.is_set() else approve(run.pk, name) for run in runs for name in tokens))
    worker.start()
    time.sleep(0.1)
    os.killpg(web.pid, signal.SIGKILL)  # the arbiter and its workers at once
    down.set()
    injected()
    worker.join()
    web.wait()
    web = start_gunicorn(env, sock)  # returns once it answers, however busy the machine
    try:
        for run in runs:
            for name in tokens:
                assert approve(run.pk, name, timeout=60) in (200, 409)  # 409: decided
    finally:
        os.killpg(web.pid, signal.SIGKILL)
        web.wait()
    for run in runs:
        assert Approval.objects.filter(step__run=run).count() == 2
        assert check_run(run.pk) == []
    assert None in answers  # the kill did land while approvals were in flight

"""One live attempt per step, with real consumer processes: who holds a step, what happens to
its command when the consumer dies, freezes or loses the database, and how it is recovered."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.conftest import make_user
from tests.support.attempts import logged_shell, overlaps, ran_to_the_end, read
from tests.support.processes import libfaketime, patience
from tests.workflows.consumers import freeze, freeze_cgroup, wait_for, wait_stopped
from workflows import engine
from workflows.engine import processes
from workflows.models import Checkpoint, Compensation, Run, Step
from workflows.recovery import sweeper
from workflows.recovery.recover import recover_run
from workflows.specs.storage import store_spec
from workflows.timing import clock
from workflows.workers import spool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]


def alive(pid: int) -> bool:
    return processes.start_time(pid) is not None


def running_step(run, key="work") -> Step:
    return wait_for(lambda: Step.objects.filter(run=run, key=key, status="running",
                                                child_pid__isnull=False).first(),
                    60, 0.05, what=f"{key} to run its command")


def one_step(name, shell, **step):
    return store_spec({"name": name, "steps": [
        {"key": "work", "run": {"shell": shell}, **step}]})[0]


def finished(run) -> str | None:
    status = Run.objects.get(pk=run.pk).status
    return status if status in ("completed", "failed", "cancelled") else None


def test_the_step_row_names_its_holder_and_command(consumers):
    consumer = consumers(workers=1)
    run = engine.open_run(one_step("identity", "sleep 1.5")).run
    step = running_step(run)
    assert step.holder_pid == consumer.proc.pid
    assert step.holder_boot_id == processes.boot_id() and step.holder_host
    assert step.holder_started == processes.start_time(consumer.proc.pid)
    assert step.child_pgid == step.child_pid and alive(step.child_pid)
    started = Checkpoint.objects.get(run=run, kind="step_started")
    assert started.evidence["holder"]["pid"] == consumer.proc.pid
    wait_for(lambda: finished(run), 20, what="the run to finish")
    done = Step.objects.get(pk=step.pk)
    assert done.last_evidence["exit_code"] == 0 and done.last_evidence["pid"] == step.child_pid
    assert done.holder_pid is None and done.child_pid is None  # shown only while running


def test_a_killed_consumer_takes_its_command_with_it(consumers, tmp_path):
    """The command would sleep 900 s and its lease lasts as long: it ends within the wait's
    bound (at most PATIENCE, 180 s) only because its consumer's death ended it."""
    consumer = consumers(workers=1, TOLLGATE_LEASE_SECONDS="900")
    run = engine.open_run(one_step("orphan", "sleep 900", max_retries=1)).run
    step = running_step(run)
    consumer.kill()
    wait_for(lambda: not alive(step.child_pid), 3, 0.02, what="the command to die")


def test_grandchildren_end_with_their_step_and_cannot_hold_it_open(consumers, tmp_path):
    pid_file = tmp_path / "grandchild"
    consumers(workers=1)
    # The grandchild keeps stdout open and outlives the command it was started by: held
    # open by it, the step would last its 900 s. It ends within the wait's bound (at most
    # PATIENCE, 180 s): no clock of this test's is read, however slow the machine.
    run = engine.open_run(one_step("grandchild", f"sleep 900 & echo $! > {pid_file}; echo hi")
                          ).run
    assert wait_for(lambda: finished(run), 20, what="the run to finish") == "completed"
    grandchild = int(pid_file.read_text())
    wait_for(lambda: not alive(grandchild), 5, 0.05, what="the grandchild to die")
    assert Step.objects.get(run=run).last_evidence["stdout"] == "hi\n"


def last_tick(log: Path) -> float:
    return max((a["last"] for attempts in read(log).values() for a in attempts), default=0.0)


def test_a_frozen_consumer_s_command_is_fenced_before_its_lease_ends(consumers, tmp_path):
    """Frozen on this machine (alive, so never reclaimed): its supervisor stops the command
    a margin before the lease it last renewed runs out; thawed, it reports the attempt as
    fenced and the step runs again, never two attempts at once."""
    log = tmp_path / "attempts.log"
    frozen = consumers(workers=1)
    run = engine.open_run(one_step("frozen", logged_shell(log, 6), max_retries=1)).run
    step = running_step(run)
    consumers(workers=1)  # a healthy consumer, with its own sweeper, stands by
    freeze(frozen.pid)
    try:
        wait_for(lambda: not alive(step.child_pid), 5, 0.05, what="the fenced command to stop")
        lease_end = Step.objects.get(pk=step.pk).lease_expires_at.timestamp()
        assert last_tick(log) < lease_end  # stopped before the lease ran out
        time.sleep(2)
        sweeper.sweep()
        held = Step.objects.get(run=run)
        assert held.status == "running" and held.attempt == 1  # its holder lives: not reclaimed
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    assert Step.objects.get(run=run).attempt == 2
    assert Checkpoint.objects.filter(run=run, kind="step_retrying",
                                     summary__contains="fenced").exists()
    assert overlaps(log) == [] and list(ran_to_the_end(log).values()) == [1]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="containers need root (unshare)")


@needs_root
def test_a_live_worker_in_another_container_is_never_judged_gone(consumers, tmp_path, people):
    """One node, one boot id, another pid namespace: its pids mean nothing here. Neither the
    sweeper nor recover declares it gone or signals its process group."""
    log = tmp_path / "attempts.log"
    boxed = consumers(workers=1, container="box-a", TOLLGATE_LEASE_SECONDS="3")
    run = engine.open_run(one_step("boxed", logged_shell(log, 3))).run
    step = running_step(run)
    assert step.holder_host == "box-a" and step.holder_pidns
    assert step.holder_pidns != processes.pid_namespace()
    assert step.holder_boot_id == processes.boot_id()
    verdicts = recover_run(run, actor=people["alice"])
    assert [(v.step, v.holder) for v in verdicts] == [("work", "unknown")]
    assert sweeper.sweep().expired == 0
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    assert Step.objects.get(run=run).attempt == 1 and overlaps(log) == []
    assert boxed.proc.poll() is None


@needs_root
def test_a_frozen_worker_elsewhere_is_reclaimed_after_its_lease_without_overlap(consumers,
                                                                                tmp_path):
    """Frozen in another container (as on another machine): it cannot be checked, so its
    lease is reclaimed after the lease and the kill grace. Its supervisor had stopped the
    command before the lease ended, so the next attempt overlaps nothing; on the shared
    spool volume the sweeper reads why the attempt ended (fenced) and retries it."""
    log = tmp_path / "attempts.log"
    frozen = consumers(workers=1, container="box-b", TOLLGATE_LEASE_SECONDS="3")
    run = engine.open_run(one_step("elsewhere", logged_shell(log, 6), max_retries=1)).run
    step = running_step(run)
    freeze(frozen.pid)
    try:
        wait_for(lambda: list(spool.root().glob(f"step-{step.pk}-*/result.json")), 30, 0.05,
                 what="its supervisor to fence the command")
        consumers(workers=1, TOLLGATE_LEASE_SECONDS="3")
        assert wait_for(lambda: finished(run), 40, what="the run to finish") == "completed"
        retried = Checkpoint.objects.get(run=run, kind="step_retrying")
        assert "worker fenced" in retried.summary
        assert retried.actor_name.startswith("worker box-b:")
        assert "its worker could not be reached" in retried.actor_name
        assert Step.objects.get(pk=step.pk).attempt == 2
        assert overlaps(log) == [] and list(ran_to_the_end(log).values()) == [1]
    finally:
        os.kill(frozen.pid, signal.SIGCONT)


def test_a_dead_holder_is_reclaimed_and_attempts_never_overlap(consumers, tmp_path):
    log = tmp_path / "attempts.log"
    first = consumers(workers=1)
    run = engine.open_run(one_step("dead", logged_shell(log, 2), max_retries=2)).run
    running_step(run)
    time.sleep(0.5)
    first.kill()
    consumers(workers=1)
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    step = Step.objects.get(run=run)
    assert step.attempt == 2 and overlaps(log) == []
    assert Checkpoint.objects.filter(run=run, kind="step_retrying").exists()


def test_recover_reclaims_a_dead_holder_at_once(consumers, tmp_path, people):
    # Its spool is out of this process's sight (as on a host whose disk is gone): recover
    # judges the holder, rather than recording what the supervisor left there.
    consumer = consumers(workers=1, TOLLGATE_LEASE_SECONDS="300",
                         TOLLGATE_SPOOL_DIR=str(tmp_path / "other-spool"))
    run = engine.open_run(one_step("recover", "sleep 30", max_retries=1)).run
    step = running_step(run)
    consumer.kill()
    with pytest.raises(engine.NotPermitted):
        recover_run(run, actor=people["bob"])
    out = io.StringIO()
    call_command("recover", str(run.pk), stdout=out)
    assert "work: holder gone" in out.getvalue()
    assert Step.objects.get(pk=step.pk).status == "retrying"
    assert Checkpoint.objects.filter(run=run, kind="step_retrying",
                                     summary__startswith="Recovered").exists()


def test_recover_leaves_a_live_holder_alone(consumers, people):
    consumers(workers=1)
    run = engine.open_run(one_step("recover-live", "sleep 2")).run
    running_step(run)
    verdicts = recover_run(run, actor=people["alice"])
    assert [(v.step, v.holder) for v in verdicts] == [("work", "alive")]
    assert wait_for(lambda: finished(run), 20, what="the run to finish") == "completed"


def compensating_spec(name, log: Path, undo_seconds=1.5):
    return store_spec({"name": name, "steps": [
        {"key": "deploy", "run": {"callable": "workflows.callables.noop"},
         "compensation": {"shell": logged_shell(log, undo_seconds)}},
        {"key": "verify", "depends_on": ["deploy"], "run": {"command": ["false"]}},
    ]})[0]


def test_a_consumer_killed_mid_compensation_runs_it_again_to_the_end(consumers, tmp_path):
    log = tmp_path / "undo.log"
    first = consumers(workers=1)
    run = engine.open_run(compensating_spec("undo-kill", log, 3)).run
    wait_for(lambda: Compensation.objects.filter(run=run, status="running").exists(), 20, 0.05,
             what="the compensation to start")
    time.sleep(0.5)
    first.kill()
    consumers(workers=1)
    wait_for(lambda: Compensation.objects.filter(run=run, status="done").exists(), 30,
             what="the compensation to finish")
    row = Compensation.objects.get(run=run)
    assert row.attempt == 2 and overlaps(log) == []
    assert list(ran_to_the_end(log).values()) == [1]
    assert Step.objects.get(run=run, key="deploy").status == "compensated"
    kinds = list(Checkpoint.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds.count("lease_recovered") == 1 and kinds.count("compensated") == 1


def test_retrying_a_compensated_run_runs_the_undone_steps_again(consumers, tmp_path):
    log = tmp_path / "undo.log"
    consumers(workers=1)
    run = engine.open_run(compensating_spec("undo-retry", log, 0.2)).run
    wait_for(lambda: Step.objects.filter(run=run, key="deploy", status="compensated").exists(),
             20, what="the compensation")
    with pytest.raises(engine.NotPermitted):
        engine.retry_step(run, "verify", actor=make_user("nobody"))
    engine.retry_step(run, "verify", actor="operator")
    wait_for(lambda: Step.objects.filter(run=run, key="deploy", attempt=2,
                                         status="compensated").exists(), 20,
             what="deploy to run again, and be undone again when verify fails again")
    assert finished(run) == "failed"
    assert Compensation.objects.filter(run=run, status="done").count() == 2


def spool_of(consumer_env: dict, tmp_path, settings) -> dict:
    """One spool for the consumers and this process: what they leave, this test sees."""
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    return {**consumer_env, "TOLLGATE_SPOOL_DIR": settings.TOLLGATE_SPOOL_DIR}


def test_a_result_finished_before_its_consumer_died_is_recorded_not_run_again(
        consumers, tmp_path, settings):
    """kill -9 in the window after the command exits and before its result is recorded:
    the next consumer on the machine records the result from the spool."""
    marks = tmp_path / "marks"
    env = spool_of({"TOLLGATE_LEASE_SECONDS": "30"}, tmp_path, settings)
    first = consumers(workers=1, **env)
    run = engine.open_run(one_step("window", f'echo "$TOLLGATE_ATTEMPT" >> {marks}; sleep 0.5; '
                                             'echo \'{"built": 1}\' > "$TOLLGATE_STATE_PATCH_FILE"',
                                   max_retries=2)).run
    step = running_step(run)
    wait_for(lambda: marks.exists(), 10, 0.01, what="the command to start")
    os.kill(first.pid, signal.SIGSTOP)  # the worker can record nothing from here on
    wait_stopped(first.pid)
    folder = spool.root() / f"step-{step.pk}-{step.lease_token}"
    wait_for(lambda: (folder / "result.json").exists(), 10, 0.05, what="the result on disk")
    first.kill()
    consumers(workers=1, **env)
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    done = Step.objects.get(pk=step.pk)
    assert done.attempt == 1 and marks.read_text().split() == ["1"]  # ran once
    assert Run.objects.get(pk=run.pk).shared_state == {"built": 1}
    assert "recorded from its spool" in Checkpoint.objects.get(
        run=run, kind="step_completed").actor_name
    # The consumer removes the folder after its commit, which a busy machine delays.
    wait_for(lambda: not folder.exists(), what="the spool folder removed once recorded")


@pytest.mark.parametrize("action, kept", [
    ({"shell": "echo done"}, "result.json"),  # the supervisor's result, in its folder
    ({"callable": "workflows.callables.count"}, "outcome.json"),  # written for a callable
])
def test_a_result_the_database_could_not_take_is_kept_until_it_returns(tmp_path, settings,
                                                                        monkeypatch, action,
                                                                        kept):
    """The report window passes with the database away: the result (a command's, or a
    callable's that ran in the worker's own process) stays in the spool, handed over, and is
    recorded once the database answers again; the step is not left running under a live
    holder that has let it go, and nothing runs twice."""
    from django.db import OperationalError

    from workflows.workers import worker

    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    settings.TOLLGATE_REPORT_RETRY_SECONDS = 0.2
    engine.open_run(store_spec({"name": "away", "steps": [{"key": "work", "run": action}]})[0])
    step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
    real = engine.complete_step
    monkeypatch.setattr(engine, "complete_step",
                        lambda *a, **k: (_ for _ in ()).throw(OperationalError("away")))
    with pytest.raises(OperationalError):
        worker._execute_one(step, "w", chain=False)
    [folder] = list(spool.root().iterdir())
    assert (folder / "handed_over").exists() and (folder / kept).exists()
    assert Step.objects.get(pk=step.pk).status == "running"
    monkeypatch.setattr(engine, "complete_step", real)
    assert worker.record_orphans(force=True) == 1
    done = Step.objects.get(pk=step.pk)
    assert done.status == "completed" and done.attempt == 1
    if "shell" in action:
        assert done.last_evidence["stdout"] == "done\n"
    else:
        assert done.run.shared_state == {"count": 1}
    assert not folder.exists()


def test_a_pooled_connection_that_lost_its_server_is_retried_like_a_blink(settings,
                                                                         monkeypatch):
    """Behind PgBouncer a killed server connection can surface as InternalError ("received
    2 results from command 'COMMIT'"): the report is retried on a fresh connection rather
    than given up, and the lease token keeps the repeat harmless."""
    from django.db import InternalError

    from workflows.workers import worker

    settings.TOLLGATE_REPORT_RETRY_SECONDS = 5
    engine.open_run(one_step("pooled", "true"))
    step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
    real, calls = engine.complete_step, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise InternalError("received 2 results from command 'COMMIT'")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "complete_step", flaky)
    assert worker._execute_one(step, "w", chain=False).kind == "step_completed"
    assert len(calls) == 2 and Step.objects.get(pk=step.pk).status == "completed"


def test_a_finished_compensation_whose_worker_died_is_recorded_not_run_again(tmp_path,
                                                                              settings):
    """The same for an undo: its result in the spool is recorded once its worker is gone."""

    from workflows.engine import compensations
    from workflows.workers import executors, worker

    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    settings.TOLLGATE_DISPATCH = False
    log = tmp_path / "undo.log"
    run = engine.open_run(compensating_spec("undo-once", log, undo_seconds=0.1)).run
    for _ in ("deploy", "verify"):
        step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
        worker._execute_one(step, "w", chain=False)
    row = compensations.claim(run.pk, owner="w", lease_seconds=30,
                              holder=processes.this_process())
    context = {"run_id": run.pk, "step_key": "deploy", "attempt": 1, "params": {},
               "lease": {"kind": "compensation", "id": row.pk, "token": row.lease_token}}
    import threading

    outcome = executors.execute(row.step.compensation, context=context, shared_state={},
                                stop=threading.Event())
    assert outcome.ok and outcome.spooled is not None
    # Its worker dies here, before recording it: its hold on the folder ends with it.
    spool._let_go(outcome.spooled)
    assert worker.record_orphans(force=True) == 1
    row.refresh_from_db()
    assert row.status == "done" and list(ran_to_the_end(log).values()) == [1]
    assert compensations.claim(run.pk, owner="w", lease_seconds=30) is None  # nothing to redo


def frozen_in_another_container(model, pk: int) -> None:
    """Its holder, as the sweeper sees it: in another pid namespace (it cannot be looked
    up) and silent past its lease and the kill grace, still holding its spool folder."""
    model.objects.filter(pk=pk).update(holder_pidns="pid:[1]",
                                       lease_expires_at=clock.now() - timedelta(minutes=5))


@pytest.mark.parametrize("kind", ["step", "compensation"])
def test_a_finished_result_whose_holder_cannot_be_checked_is_recorded_not_run_again(
        tmp_path, settings, kind):
    """A consumer in another container on the same spool volume froze after its command
    finished, past its lease and the kill grace: the sweeper records the finished result
    from the spool instead of reclaiming the lease and running the command again; the
    holder's own report, when it comes back, records nothing twice."""
    import threading

    from workflows.engine import compensations
    from workflows.workers import executors, worker

    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    settings.TOLLGATE_DISPATCH = False
    log = tmp_path / "ran.log"
    spec = (store_spec({"name": "frozen", "steps": [
        {"key": "deploy", "run": {"shell": logged_shell(log, 0.1)}}]})[0] if kind == "step"
        else compensating_spec("frozen-undo", log, undo_seconds=0.1))
    run = engine.open_run(spec).run
    if kind == "step":
        row = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
        action, lease_kind, model = row.config["run"], "step", Step
    else:
        for _ in ("deploy", "verify"):
            step = engine.claim_next(owner="w", lease_seconds=30,
                                     holder=processes.this_process())
            worker._execute_one(step, "w", chain=False)
        row = compensations.claim(run.pk, owner="w", lease_seconds=30,
                                  holder=processes.this_process())
        action, lease_kind, model = row.step.compensation, "compensation", Compensation
    context = {"run_id": run.pk, "step_key": "deploy", "attempt": 1, "params": {},
               "lease": {"kind": lease_kind, "id": row.pk, "token": row.lease_token}}
    outcome = executors.execute(action, context=context, shared_state={},
                                stop=threading.Event())
    assert outcome.ok and spool.orphans() == []  # its holder still holds the folder
    frozen_in_another_container(model, row.pk)
    sweeper.sweep()
    if kind == "step":
        done = Step.objects.get(pk=row.pk)
        assert done.status == "completed" and done.attempt == 1
        assert list(ran_to_the_end(log).values()) == [1]
        # The holder comes back and reports: recorded already, nothing twice.
        engine.complete_step(run.pk, "deploy", lease_token=row.lease_token, actor="worker w")
        assert Checkpoint.objects.filter(run=run, kind="step_completed").count() == 1
    else:
        row.refresh_from_db()
        assert row.status == "done" and list(ran_to_the_end(log).values()) == [1]
        assert compensations.claim(run.pk, owner="w", lease_seconds=30) is None
        assert compensations.finish(row.pk, row.lease_token, ok=True) is None
    assert not outcome.spooled.exists()


on_postgresql = pytest.mark.skipif(
    "sqlite" in os.environ.get("DATABASE_URL", "sqlite"),
    reason="SQLite's clock is each process's own: one machine, one clock")
has_faketime = pytest.mark.skipif(not libfaketime(), reason="needs faketime (libfaketime)")


@needs_root
@on_postgresql
@has_faketime
@pytest.mark.parametrize("skew", ["-30s", "+60s", ""])
def test_a_worker_with_a_skewed_clock_keeps_its_lease_and_its_retry_times(consumers, tmp_path,
                                                                          skew, settings):
    """Leases and retries are on the database's clock: a healthy remote worker 30 s behind
    keeps its live lease (no reclaim, no overlap), and a 1 s retry comes within a sweep or
    two of its time (the sweeper rings for retries due on the database's clock, whatever
    the clock of the consumer that scheduled the doorbell), not 30 or 60 s late."""
    settings.TOLLGATE_SWEEP_SECONDS = 1  # this process sweeps as the consumers do
    log = tmp_path / "attempts.log"
    consumers(workers=1, container="skewed", skew=skew, TOLLGATE_LEASE_SECONDS="2")
    name = {"-30s": "behind", "+60s": "ahead", "": "on-time"}[skew]
    spec = store_spec({"name": name, "steps": [
        {"key": "work", "run": {"shell": logged_shell(log, 3)}, "max_retries": 1},
        {"key": "flaky", "depends_on": ["work"], "max_retries": 1, "retry_backoff_seconds": 1,
         "run": {"shell": f'test -e {tmp_path}/second || {{ touch {tmp_path}/second; '
                          'exit 1; }'}}]})[0]
    run = engine.open_run(spec).run
    running_step(run)
    deadline = time.monotonic() + patience(30)
    while not finished(run) and time.monotonic() < deadline:
        assert sweeper.sweep().expired == 0  # never judged dead: its lease is current
        time.sleep(0.3)
    assert finished(run) == "completed"
    assert Step.objects.get(run=run, key="work").attempt == 1 and overlaps(log) == []
    flaky = Checkpoint.objects.filter(run=run, step__key="flaky").order_by("seq")
    failed = flaky.get(kind="step_retrying").at
    retried = flaky.filter(kind="step_started").order_by("-seq").first().at
    # The 1 s backoff, on the database's clock: never the 30 s or 60 s the consumer's own
    # clock is off by (a machine however slow takes nowhere near that for a 1 s wait).
    assert (retried - failed).total_seconds() < 25


@on_postgresql
@pytest.mark.parametrize("step", ["217", "-217"])
def test_a_consumer_whose_clock_steps_decides_nothing_early_and_keeps_its_leases(
        consumers, tmp_path, step, settings):
    """A consumer's wall clock steps 217 s (an NTP step, a resumed VM) while it holds a
    running command and runs the deadline, reminder and sweep tasks every second: no gate
    is rejected before its deadline, no reminder goes early, no live lease is taken back."""
    offset = tmp_path / "offset"
    offset.write_text("0")
    log = tmp_path / "attempts.log"
    consumers(workers=2, wall_step=str(offset), TOLLGATE_LEASE_SECONDS="3",
              TOLLGATE_SWEEP_SECONDS="1")
    spec = store_spec({"name": "stepped", "steps": [
        {"key": "work", "run": {"shell": logged_shell(log, 8)}},
        {"key": "ok", "approval": {"group": "qa", "timeout_seconds": 120,
                                   "remind_after_seconds": 100}}]})[0]
    run = engine.open_run(spec).run
    running_step(run)
    offset.write_text(step)  # the consumer's clock steps
    wait_for(lambda: finished(run) or Step.objects.get(run=run, key="work").status
             == "completed", 60, 0.2, what="the command to finish")
    time.sleep(3)  # three more ticks of every periodic task on the stepped clock
    gate = Step.objects.get(run=run, key="ok")
    assert gate.status == "waiting_approval" and gate.reminders_sent == 0
    kinds = set(Checkpoint.objects.filter(run=run).values_list("kind", flat=True))
    assert not kinds & {"gate_timed_out", "gate_reminded", "lease_recovered", "step_retrying"}
    work = Step.objects.get(run=run, key="work")
    assert (work.status, work.attempt) == ("completed", 1) and overlaps(log) == []


def test_skipping_a_running_command_stops_its_process_tree(consumers, tmp_path, people):
    """An operator skips a running step: its command and what it started are stopped, the
    run moves on, and the skip is one checkpoint."""
    from django.test import Client

    from workflows.models import ApiToken

    grandchild = tmp_path / "grandchild"
    consumers(workers=1)
    spec = store_spec({"name": "skip-running", "steps": [
        {"key": "work", "run": {"shell": f"sleep 60 & echo $! > {grandchild}; sleep 60"}},
        {"key": "after", "depends_on": ["work"], "run": {"callable": "workflows.callables.noop"}},
    ]})[0]
    run = engine.open_run(spec).run
    step = running_step(run)
    wait_for(lambda: grandchild.exists() and grandchild.read_text().strip(), 10, 0.05,
             what="the grandchild")
    token = ApiToken.objects.issue(people["alice"], "ops")[1]
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        f"/api/runs/{run.pk}/steps/work/skip", {"reason": "done by hand"},
        content_type="application/json")
    assert response.status_code == 200, response.content
    wait_for(lambda: not alive(step.child_pid), 10, 0.05, what="the command to stop")
    wait_for(lambda: not alive(int(grandchild.read_text())), 10, 0.05,
             what="the grandchild to stop")
    assert wait_for(lambda: finished(run), 20, what="the run to finish") == "completed"
    assert Checkpoint.objects.filter(run=run, kind="step_skipped").count() == 1
    assert Step.objects.get(pk=step.pk).status == "skipped"


@needs_root
def test_a_container_restarted_after_its_command_exited_records_the_result(
        consumers, tmp_path, settings):
    """`docker restart`: the same host name and spool volume, a new pid namespace. The old
    incarnation's finished result is recorded by the new one, not run again."""
    marks = tmp_path / "marks"
    env = spool_of({"TOLLGATE_LEASE_SECONDS": "60"}, tmp_path, settings)
    first = consumers(workers=1, container="box-r", **env)
    run = engine.open_run(one_step("restarted", f'echo "$TOLLGATE_ATTEMPT" >> {marks}; '
                                                'sleep 0.5; echo done', max_retries=2)).run
    step = running_step(run)
    assert step.holder_host == "box-r"
    wait_for(lambda: marks.exists(), 10, 0.01, what="the command to start")
    freeze(first.pid)  # the worker records nothing from here on
    folder = spool.root() / f"step-{step.pk}-{step.lease_token}"
    wait_for(lambda: (folder / "result.json").exists(), 10, 0.05, what="the result on disk")
    first.kill()  # the container stops: every process of its namespace with it
    consumers(workers=1, container="box-r", **env)
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    done = Step.objects.get(pk=step.pk)
    assert done.attempt == 1 and marks.read_text().split() == ["1"]  # ran once
    assert done.last_evidence["stdout"] == "done\n"
    assert "recorded from its spool" in Checkpoint.objects.get(
        run=run, kind="step_completed").actor_name


def test_a_command_that_exits_0_as_its_consumer_dies_is_finished_not_run_again(
        consumers, tmp_path, settings):
    """Its consumer killed, the supervisor asks the command to stop; the command traps
    SIGTERM and exits 0 by itself. That exit code is its result: recorded, not re-run."""
    marks = tmp_path / "marks"
    env = spool_of({"TOLLGATE_LEASE_SECONDS": "60"}, tmp_path, settings)
    first = consumers(workers=1, **env)
    run = engine.open_run(one_step("trapping", (
        f'echo "start $TOLLGATE_ATTEMPT" >> {marks}; '
        f'trap \'echo "term $TOLLGATE_ATTEMPT" >> {marks}; exit 0\' TERM; '
        'sleep 30 & wait $!'), max_retries=2)).run
    step = running_step(run)
    wait_for(lambda: marks.exists(), 10, 0.01, what="the command to start")
    first.kill()
    wait_for(lambda: "term" in marks.read_text(), 10, 0.05, what="the command to be stopped")
    consumers(workers=1, **env)
    assert wait_for(lambda: finished(run), 30, what="the run to finish") == "completed"
    done = Step.objects.get(pk=step.pk)
    assert done.attempt == 1 and marks.read_text().split("\n")[:2] == ["start 1", "term 1"]
    assert done.last_evidence["exit_code"] == 0
    assert done.last_evidence["stopped_then_exited"] == "owner_gone"


RESOURCE = '''
import fcntl, json, os, sys
path, scope = sys.argv[1], os.environ["TOLLGATE_FENCING_SCOPE"]
token = int(os.environ["TOLLGATE_FENCING_TOKEN"])
with open(path + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = json.load(open(path)) if os.path.exists(path) else {"highest": {}, "log": []}
    verdict = "refused" if token < state["highest"].get(scope, 0) else "accepted"
    if verdict == "accepted":
        state["highest"][scope] = token
    state["log"].append([verdict, token])
    json.dump(state, open(path, "w"))
'''
FREEZER = Path("/sys/fs/cgroup/freezer")


@needs_root
@pytest.mark.skipif(not (FREEZER / "cgroup.procs").exists(),
                    reason="needs the cgroup freezer (as docker pause uses)")
def test_a_paused_container_s_late_write_is_refused_by_its_fencing_token(
        consumers, tmp_path, settings):
    """A whole container paused past its lease (cgroup freezer: consumer, supervisor and
    command frozen together) acts once more when thawed, beside the attempt that replaced
    it. The fencing token is what lets the resource it writes to refuse that late write."""
    import sys

    script, store, release = tmp_path / "resource.py", tmp_path / "resource.json", \
        tmp_path / "release"
    script.write_text(RESOURCE)
    # Attempt 1 waits for the test's word (it is paused meanwhile); a later one writes now.
    shell = (f'trap "" TERM; echo "$TOLLGATE_FENCING_TOKEN" >> {tmp_path}/started; '
             f'while [ "$TOLLGATE_FENCING_TOKEN" = 1 ] && [ ! -e {release} ]; do sleep 0.05; '
             f'done; {sys.executable} {script} {store}')
    cgroup = FREEZER / f"tollgate-test-{os.getpid()}"
    cgroup.mkdir()
    paused = consumers(workers=1, container="box-p", TOLLGATE_LEASE_SECONDS="3",
                       TOLLGATE_KILL_GRACE_SECONDS="5")
    try:
        for pid in (paused.proc.pid, paused.pid):
            (cgroup / "cgroup.procs").write_text(str(pid))
        run = engine.open_run(one_step("paused", shell, max_retries=1)).run
        wait_for(lambda: (tmp_path / "started").exists(), 30, 0.05, what="attempt 1")
        freeze_cgroup(cgroup)
        consumers(workers=1, TOLLGATE_LEASE_SECONDS="3")
        assert wait_for(lambda: finished(run), 40, what="attempt 2") == "completed"
        assert Step.objects.get(run=run).attempt == 2
        release.touch()
    finally:
        (cgroup / "freezer.state").write_text("THAWED")
    log = wait_for(lambda: len(json.loads(store.read_text())["log"]) == 2
                   and json.loads(store.read_text())["log"], 20, what="the late write")
    assert log == [["accepted", 2], ["refused", 1]]
    paused.kill()
    wait_for(lambda: not (cgroup / "cgroup.procs").read_text().strip(), 10,
             what="the paused container's processes to end")
    cgroup.rmdir()

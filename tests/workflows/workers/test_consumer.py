"""Steps executed by real Huey consumer processes, including ones killed with SIGKILL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from huey.contrib.djhuey import HUEY

from tests.workflows.consumers import wait_for
from workflows import engine
from workflows.models import Checkpoint, Run, Step
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]


def run_status(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


def closed(run: Run) -> bool:
    return run_status(run) in ("completed", "failed", "cancelled")


def completions(run: Run) -> dict[str, int]:
    keys = Checkpoint.objects.filter(run=run, kind="step_completed").values_list(
        "step__key", flat=True)
    return {key: list(keys).count(key) for key in set(keys)}


def test_parallel_branches_run_at_the_same_time(consumers):
    spec = store_spec({"name": "fan", "steps": [
        {"key": "start", "run": {"callable": "workflows.callables.noop"}},
        {"key": "left", "depends_on": ["start"], "run": {"command": ["sleep", "1.5"]}},
        {"key": "right", "depends_on": ["start"], "run": {"command": ["sleep", "1.5"]}},
        {"key": "join", "depends_on": ["left", "right"],
         "run": {"callable": "workflows.callables.noop"}},
    ]})[0]
    consumers(workers=2)
    run = engine.open_run(spec).run
    wait_for(lambda: closed(run), 60, what="the run to finish")
    assert run_status(run) == "completed"
    left, right = Step.objects.get(run=run, key="left"), Step.objects.get(run=run, key="right")
    assert left.started_at < right.finished_at and right.started_at < left.finished_at
    assert completions(run) == {"start": 1, "left": 1, "right": 1, "join": 1}


def test_sigkill_mid_step_is_recovered_by_a_new_consumer(consumers, tmp_path):
    spec = store_spec({"name": "crash", "steps": [
        {"key": "slow", "max_retries": 2,
         "run": {"shell": f"echo started >> {tmp_path}/attempts; sleep 3"}},
        {"key": "after", "depends_on": ["slow"], "run": {"callable": "workflows.callables.noop"}},
    ]})[0]
    first = consumers(workers=1)
    run = engine.open_run(spec).run
    attempts = tmp_path / "attempts"
    wait_for(lambda: attempts.exists() and "started" in attempts.read_text(), 30,
             what="the step's command to start")
    first.kill()
    consumers(workers=1)
    wait_for(lambda: closed(run), 60, what="the run to finish after the crash")
    assert run_status(run) == "completed"
    slow = Step.objects.get(run=run, key="slow")
    assert slow.attempt == 2
    assert completions(run) == {"slow": 1, "after": 1}
    # Reclaimed by the sweeper, or recorded from the spool by the next consumer: the
    # supervisor noted that its worker died and stopped the command.
    expired = Checkpoint.objects.get(run=run, kind="step_retrying")
    assert ("Lease" in expired.summary and expired.actor_name.startswith("sweeper")) or (
        "the worker running it died" in expired.summary)
    assert attempts.read_text().count("started") == 2


def test_sigkill_mid_batch_charges_only_the_step_that_began(consumers, tmp_path):
    """Six one-step runs with no retries, claimed as one batch; the consumer is killed with
    SIGKILL while the first runs. The next consumer's sweeper gives the five that never
    began back unspent, and they run: only the one that began is charged (and, with no
    retries, fails as its policy says)."""
    attempts = tmp_path / "attempts"
    spec = store_spec({"name": "batch", "steps": [
        {"key": "work", "max_retries": 0,
         "run": {"shell": f"echo $TOLLGATE_RUN_ID >> {attempts}; sleep 2"}}]})[0]
    runs = [engine.open_run(spec).run for _ in range(6)]
    env = {"TOLLGATE_SPOOL_DIR": str(tmp_path / "spool"), "TOLLGATE_LEASE_SECONDS": "2",
           "TOLLGATE_SWEEP_SECONDS": "1", "TOLLGATE_GROUP_COMMIT_STEPS": "8"}
    first = consumers(workers=1, **env)
    wait_for(lambda: attempts.exists() and attempts.read_text().strip(), 30,
             what="the batch's first command to start")
    assert Step.objects.filter(run__in=runs, status="running").count() == 6  # one batch
    first.kill()
    consumers(workers=1, **env)
    wait_for(lambda: all(closed(run) for run in runs), 90, what="every run to end")
    began = attempts.read_text().split()
    statuses = [run_status(run) for run in runs]
    assert statuses.count("completed") == 5 and statuses.count("failed") == 1, statuses
    failed = next(run for run in runs if run_status(run) == "failed")
    assert began.count(str(failed.pk)) == 1  # it began once, and was not run again
    assert Checkpoint.objects.filter(run__in=runs, kind="step_released").count() == 5
    assert all(began.count(str(run.pk)) == 1 for run in runs)  # each command ran once


def test_cancel_stops_a_running_sleep(consumers, tmp_path):
    pid_file = tmp_path / "pid"
    spec = store_spec({"name": "long", "steps": [
        {"key": "wait", "run": {"shell": f"echo $$ > {pid_file}; exec sleep 900"}}]})[0]
    consumers(workers=1)
    run = engine.open_run(spec).run
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30,
             what="the sleep to start")
    pid = int(pid_file.read_text())
    engine.cancel_run(run, actor="test", reason="stop it")

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").exists() and " Z " in Path(f"/proc/{pid}/stat").read_text()

    # The sleep would last 900 s: gone within the wait's bound (at most PATIENCE, 180 s), the
    # cancel ended it (within two heartbeats of its lease, about 1.4 s, on a quiet machine).
    wait_for(gone, 10, 0.05, what="the sleep process to be terminated")
    assert Step.objects.get(run=run, key="wait").status == "cancelled"
    note = wait_for(lambda: Checkpoint.objects.filter(run=run, kind="stale_result").first(), 10,
                    what="the stopped worker's report")
    assert note.evidence.get("token")


def test_two_consumers_run_every_step_exactly_once(consumers, tmp_path):
    trace = tmp_path / "trace"
    steps = [{"key": f"s{i}", "run": {"callable": "tests.callables.record"}}
             for i in range(100)]
    spec = store_spec({"name": "wide", "steps": steps})[0]
    HUEY.storage.flush_results()
    # The first run on one consumer alone, the second on two at once: every consumer that
    # ran is seen in the trace, whatever the machine's pace, and two consumers share the
    # second run's hundred steps without running one twice.
    first = consumers(workers=2, TOLLGATE_TRACE_FILE=str(trace))
    runs = [engine.open_run(spec, shared_state={"record_seconds": 0.01}).run]
    wait_for(lambda: closed(runs[0]), 120, 0.25, what="the first run's 100 steps")
    first.stop()
    consumers(workers=2, TOLLGATE_TRACE_FILE=str(trace))
    consumers(workers=2, TOLLGATE_TRACE_FILE=str(trace))
    runs.append(engine.open_run(spec, shared_state={"record_seconds": 0.01}).run)
    for run in runs:
        wait_for(lambda run=run: closed(run), 120, 0.25, what="200 steps to finish")
        assert run_status(run) == "completed"
    lines = trace.read_text().splitlines()
    executed = [line.rsplit(":", 2)[0] for line in lines]
    assert len(executed) == 200 and len(set(executed)) == 200
    pids = {run.pk: {line.rsplit(":", 1)[1] for line in lines
                     if line.startswith(f"{run.pk}:")} for run in runs}
    assert pids[runs[0].pk] == {str(first.pid)} and str(first.pid) not in pids[runs[1].pk]
    for run in runs:
        assert set(completions(run).values()) == {1}
    assert HUEY.storage.result_store_size() == 0  # doorbells leave nothing behind in the queue


def test_a_run_inside_a_run_end_to_end_with_a_consumer_killed_in_the_child(consumers,
                                                                          tmp_path):
    """The parent's workflow step opens one child; a consumer SIGKILLed while the child's
    command runs is replaced; the child completes, the outbox tells the parent, and the
    parent completes, with one child and no step of it run twice to the end."""
    marks = tmp_path / "marks"
    store_spec({"name": "inner", "steps": [
        {"key": "work", "max_retries": 3,
         "run": {"shell": f"echo start >> {marks}; sleep 2; echo done >> {marks}"}}]})
    spec = store_spec({"name": "outer", "steps": [
        {"key": "child", "run": {"workflow": "inner"}},
        {"key": "after", "depends_on": ["child"],
         "run": {"callable": "workflows.callables.noop"}}]})[0]
    first = consumers(workers=2)
    run = engine.open_run(spec).run
    wait_for(lambda: marks.exists(), 30, what="the child's command to start")
    first.kill()
    consumers(workers=2)
    wait_for(lambda: closed(run), 90, what="the parent run to finish")
    assert run_status(run) == "completed"
    [child] = Run.objects.filter(parent_step__run=run)
    assert child.status == "completed"
    assert marks.read_text().split().count("done") == 1
    assert Step.objects.get(run=run, key="child").child_run_id == child.pk

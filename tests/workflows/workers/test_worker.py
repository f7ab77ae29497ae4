"""The worker's protocol in-process: leases, stale results, compensation, the sweeper."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.workflows.helpers import kinds, status
from workflows import engine
from workflows.models import Checkpoint, Run, Step
from workflows.recovery import sweeper
from workflows.specs.storage import store_spec
from workflows.workers import worker

pytestmark = pytest.mark.django_db


def spec(*steps):
    return store_spec({"name": "w", "steps": list(steps)})[0]


def step_id(run, key):
    return Step.objects.get(run=run, key=key).pk


def test_worker_runs_a_command_step_to_completion(db):
    run = engine.open_run(spec({"key": "a", "run": {"shell": "echo hi"}})).run
    assert worker.run_step(step_id(run, "a")) == "step_completed"
    a = Step.objects.get(run=run, key="a")
    assert a.status == "completed" and a.last_evidence["stdout"] == "hi\n"
    assert a.lease_token == "" and status(run)["run"] == "completed"


def test_second_doorbell_for_a_claimed_step_does_nothing(db):
    run = engine.open_run(spec({"key": "a", "run": {"command": ["true"]}})).run
    engine.start_step(run, "a", owner="other", lease_seconds=30)
    assert worker.run_step(step_id(run, "a")) == "not-ready"
    assert kinds(run) == ["run_opened", "step_started"]


@pytest.mark.django_db(transaction=True)
def test_result_after_losing_the_lease_is_recorded_as_stale(settings):
    settings.TOLLGATE_LEASE_SECONDS = 0.6
    run = engine.open_run(spec({"key": "a", "max_retries": 1,
                                "run": {"command": ["sleep", "30"]}})).run
    result = {}

    def work():
        from django.db import connection

        try:
            result.update(kind=worker.run_step(step_id(run, "a")))
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    first = None
    for _ in range(100):
        first = Step.objects.get(run=run, key="a")
        if first.status == "running":
            break
        threading.Event().wait(0.05)
    # The sweeper takes the step away as if this worker had stalled, then another claims it.
    Step.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now()
                                            - timedelta(seconds=1))
    engine.expire_lease(first.pk)
    Step.objects.filter(pk=first.pk).update(retry_after=None)
    second = engine.start_step(run, "a", owner="second", lease_seconds=60)
    thread.join(timeout=20)
    assert result["kind"] == "stale_result"
    stale = Checkpoint.objects.get(run=run, kind="stale_result")
    assert stale.evidence["token"] == first.lease_token
    current = Step.objects.get(run=run, key="a")
    assert current.status == "running" and current.lease_token == second.lease_token


def test_compensation_runs_in_reverse_order_of_completion(db, tmp_path):
    log = tmp_path / "undo"
    run = engine.open_run(spec(
        {"key": "a", "run": {"command": ["true"]},
         "compensation": {"shell": f"echo undo-a >> {log}"}},
        {"key": "b", "depends_on": ["a"], "run": {"command": ["true"]},
         "compensation": {"shell": f"echo undo-b >> {log}"}},
        {"key": "c", "depends_on": ["b"], "run": {"command": ["false"]}},
    )).run
    for key in "abc":
        worker.run_step(step_id(run, key))
    assert status(run)["run"] == "failed"
    assert worker.compensate_run(run.pk) == ["b", "a"]
    assert log.read_text() == "undo-b\nundo-a\n"
    assert kinds(run)[-2:] == ["compensated", "compensated"]
    assert worker.compensate_run(run.pk) == []  # a duplicate message undoes nothing twice


def test_failed_run_rings_compensation_after_commit(db, settings, monkeypatch,
                                                    django_capture_on_commit_callbacks):
    settings.TOLLGATE_DISPATCH = True
    rung = []
    monkeypatch.setattr("workflows.delivery.dispatch.compensate", rung.append)
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: None)
    run = engine.open_run(spec(
        {"key": "a", "run": {"command": ["true"]}, "compensation": {"command": ["true"]}},
        {"key": "b", "depends_on": ["a"], "run": {"command": ["false"]}})).run
    engine.start_step(run, "a")
    engine.complete_step(run, "a")
    engine.start_step(run, "b")
    with django_capture_on_commit_callbacks(execute=True):
        engine.fail_step(run, "b", retryable=False)
    assert rung == [run.pk]


def test_a_failed_run_with_nothing_to_undo_rings_no_compensation(
        db, settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.TOLLGATE_DISPATCH = True
    rung = []
    monkeypatch.setattr("workflows.delivery.dispatch.compensate", rung.append)
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: None)
    run = engine.open_run(spec({"key": "a", "run": {"command": ["false"]}})).run
    engine.start_step(run, "a")
    with django_capture_on_commit_callbacks(execute=True):
        engine.fail_step(run, "a", retryable=False)
    assert rung == [] and status(run)["run"] == "failed"


def test_sweeper_expires_dead_leases_into_retry_or_failure(db):
    retry = engine.open_run(spec({"key": "a", "max_retries": 1,
                                  "run": {"command": ["true"]}})).run
    store_spec({"name": "once", "steps": [{"key": "a", "run": {"command": ["true"]}}]})
    once = engine.open_run("once").run
    for run in (retry, once):
        engine.start_step(run, "a", owner="dead-worker", lease_seconds=30)
    Step.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    report = sweeper.sweep()
    assert report.expired == 2
    assert status(retry)["a"] == "retrying" and status(once)["a"] == "failed"
    assert sweeper.sweep().expired == 0


def test_a_sweep_batch_takes_the_same_statements_for_any_number_of_runs(
        db, settings, monkeypatch, django_capture_on_commit_callbacks):
    """Dead leases that each fail their run, whose completed step owes a compensation and
    whose failure owes mail: the sweeper's batch locks and reads its runs, plans their
    compensations and writes their outbox rows in as many statements for twenty runs as
    for two (on PostgreSQL the rows' own writes too, in one round trip; SQLite, in
    process, sends those one by one); each run's compensation is planned once, and rung."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workflows.models import Compensation, OutboxMessage

    settings.TOLLGATE_NOTIFY = settings.TOLLGATE_DISPATCH = True
    rung = []
    monkeypatch.setattr("workflows.delivery.dispatch.compensate", rung.append)
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: None)
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", lambda message_id: None)
    store_spec({"name": "undone", "steps": [
        {"key": "deploy", "run": {"command": ["true"]}, "compensation": {"command": ["true"]}},
        {"key": "verify", "depends_on": ["deploy"], "run": {"command": ["true"]}}]})

    def expire(count: int) -> tuple[list[Run], list[str]]:
        runs = [engine.open_run("undone").run for _ in range(count)]
        leases = {}
        for run in runs:
            engine.start_step(run, "deploy")
            engine.complete_step(run, "deploy")
            leases[run.pk] = [engine.start_step(run, "verify", owner="gone",
                                                lease_seconds=30).pk]
        Step.objects.filter(key="verify").update(
            lease_expires_at=timezone.now() - timedelta(seconds=5))
        with django_capture_on_commit_callbacks(execute=True), \
                CaptureQueriesContext(connection) as queries:
            assert len(engine.expire_leases(leases)) == count
        return runs, [query["sql"] for query in queries.captured_queries]

    few, few_statements = expire(2)
    many, many_statements = expire(20)
    reads_and_inserts = [
        [q for q in statements if q.startswith(("SELECT", 'INSERT INTO "workflows_outbox',
                                                'INSERT INTO "workflows_compensation'))]
        for statements in (few_statements, many_statements)]
    assert len(reads_and_inserts[0]) == len(reads_and_inserts[1])
    if connection.vendor == "postgresql":
        assert len(many_statements) == len(few_statements)
    for run in few + many:
        assert status(run)["run"] == "failed"
        assert list(Compensation.objects.filter(run=run).values_list(
            "step__key", "order")) == [("deploy", 1)]
        assert OutboxMessage.objects.filter(run=run, job="notify").count() == 1
    assert sorted(rung) == sorted(run.pk for run in few + many)


def test_sweeper_rings_for_runs_no_worker_served(db, settings, monkeypatch):
    woken = []
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: woken.append(
        (count, priority)))
    run = engine.open_run(spec({"key": "a", "run": {"command": ["true"]}})).run
    assert Run.objects.get(pk=run.pk).claimable_at is not None
    assert sweeper.sweep().rerung == 0  # just opened: its doorbell may still be in the queue
    later = timezone.now() + timedelta(seconds=3 * settings.TOLLGATE_SWEEP_SECONDS)
    assert sweeper.sweep(now=later).rerung == 1 and woken == [(1, 1)]
    engine.start_step(run, "a", owner="w", lease_seconds=30)  # served: nothing left to claim
    assert sweeper.sweep(now=later).rerung == 0 and woken == [(1, 1)]


def test_sweeper_rings_for_due_retries_but_not_runs_held_by_a_failure(db, settings,
                                                                     monkeypatch):
    woken = []
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: woken.append(
        count))
    flaky = engine.open_run(spec({"key": "a", "max_retries": 2, "retry_backoff_seconds": 60,
                                  "run": {"command": ["true"]}}))
    engine.start_step(flaky.run, "a")
    engine.fail_step(flaky.run, "a")  # retrying
    store_spec({"name": "held", "steps": [
        {"key": "broken", "run": {"command": ["false"]}},
        {"key": "slow", "run": {"command": ["true"]}},
        {"key": "idle", "run": {"command": ["true"]}},
    ]})
    held = engine.open_run("held").run
    for key in ("broken", "slow"):
        engine.start_step(held, key)
    # Still running (slow is active), but a hard failure holds back "idle".
    engine.fail_step(held, "broken", retryable=False)
    assert status(held)["run"] == "running"
    assert Run.objects.get(pk=held.pk).claimable_at is None
    retry_at = Run.objects.get(pk=flaky.run.pk).claimable_at
    assert retry_at == Step.objects.get(run=flaky.run, key="a").retry_after
    later = max(retry_at, timezone.now()) + timedelta(
        seconds=3 * settings.TOLLGATE_SWEEP_SECONDS)
    assert sweeper.sweep(now=later).rerung == 1
    assert woken == [1]


def test_expired_lease_query_uses_the_partial_index(db):
    from django.db import connection

    query = Step.objects.filter(status="running", lease_expires_at__lt=timezone.now()).order_by(
        "lease_expires_at").values_list("pk", flat=True)[:1000]
    plan = query.explain()
    if connection.vendor == "sqlite":
        assert "step_running_lease_idx" in plan
    else:
        # PostgreSQL may prefer a seq scan on a tiny table; forbid that to see the index is usable.
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
            plan = query.explain()
            cursor.execute("RESET enable_seqscan")
        assert "step_running_lease_idx" in plan


def test_sweeper_reschedules_runs_whose_ready_steps_lost_their_claim_time(db, settings,
                                                                         monkeypatch):
    """A run with a ready or due retrying step but no claim time (a crash between, or rows
    from before claim times) is scheduled again; one held back by a failure is left alone."""
    monkeypatch.setattr("workflows.delivery.dispatch.wake", lambda count, priority=1: None)
    ready = engine.open_run(spec({"key": "a", "run": {"command": ["true"]}})).run
    retrying = engine.open_run(spec({"key": "a", "max_retries": 2, "retry_backoff_seconds": 1,
                                     "run": {"command": ["true"]}})).run
    engine.start_step(retrying, "a")
    engine.fail_step(retrying, "a")
    held = engine.open_run(spec(*({"key": key, "run": {"command": ["true"]}}
                                  for key in ("broken", "slow", "idle")))).run
    for key in ("broken", "slow"):
        engine.start_step(held, key)
    engine.fail_step(held, "broken", retryable=False)  # "idle" is ready but held back
    assert status(held)["run"] == "running"
    long_ago = timezone.now() - timedelta(hours=1)
    Run.objects.update(claimable_at=None, updated_at=long_ago)
    sweeper.sweep(now=timezone.now() + timedelta(seconds=5))
    scheduled = dict(Run.objects.values_list("pk", "claimable_at"))
    assert scheduled[ready.pk] is not None and scheduled[retrying.pk] is not None
    assert scheduled[held.pk] is None


def test_a_queue_that_is_down_does_not_undo_the_transition(
        db, settings, monkeypatch, caplog, django_capture_on_commit_callbacks):
    """The doorbell fails after the commit: the run is open and claimable all the same (the
    sweeper rings again), the failure is logged once, and no more doorbells are tried."""
    from workflows.delivery import dispatch

    tries = []

    def down(*args, **kwargs):
        tries.append(kwargs)
        raise ConnectionError("queue down")

    settings.TOLLGATE_DISPATCH = True
    monkeypatch.setitem(dispatch._tasks, "work", down)
    with (caplog.at_level("ERROR", logger=dispatch.log.name),
          django_capture_on_commit_callbacks(execute=True)):
        run = engine.open_run(spec(*({"key": key, "run": {"command": ["true"]}}
                                     for key in ("a", "b", "c")))).run
    assert Run.objects.get(pk=run.pk).claimable_at is not None
    assert len(tries) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Could not enqueue a doorbell; the sweeper will ring again"]

"""Group commits: a worker records a batch of steps of different runs, and claims its next
ones, in one transaction; each step keeps its own checkpoint, lease and fate."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from tests.support.processes import patience, wait_for
from workflows import engine
from workflows.engine import batches
from workflows.models import Checkpoint, Run, Step
from workflows.specs.storage import store_spec
from workflows.workers import worker

NOOP = {"callable": "workflows.callables.noop"}


@pytest.fixture(autouse=True)
def test_callables(settings):
    settings.TOLLGATE_CALLABLES = ["workflows.callables.*", "tests.callables.*"]


def chain(name: str, length: int, run=NOOP) -> str:
    store_spec({"name": name, "steps": [
        {"key": f"s{i}", "run": run, **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(length)]})
    return name


@pytest.fixture
def batch_sizes(monkeypatch):
    """How many reports each group commit carried."""
    sizes = []
    real = batches.record_many

    def spy(reports, **kwargs):
        sizes.append(len(reports))
        return real(reports, **kwargs)

    monkeypatch.setattr(batches, "record_many", spy)
    return sizes


def before_attempting(monkeypatch, run, act):
    """Do `act()` in the worker, just before it runs the batch's step of `run`."""
    real = worker._attempt

    def meanwhile(action, context, *args):
        if context["run_id"] == run.pk:
            act()
        return real(action, context, *args)

    monkeypatch.setattr(worker, "_attempt", meanwhile)


def assert_each_step_ran_once(runs):
    for run in runs:
        seqs = list(Checkpoint.objects.filter(run=run).order_by("seq")
                    .values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))  # gapless: nothing lost or doubled
        for step in Step.objects.filter(run=run):
            kinds = list(Checkpoint.objects.filter(step=step).values_list("kind", flat=True))
            assert sorted(kinds) == ["step_completed", "step_started"], (step.key, kinds)


@pytest.mark.django_db
def test_a_backlog_is_recorded_a_batch_at_a_time(settings, batch_sizes):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 4
    chain("line", 3)
    runs = [engine.open_run("line").run for _ in range(6)]
    assert worker.work() == 18
    assert {run.status for run in Run.objects.filter(pk__in=[r.pk for r in runs])} == {
        "completed"}
    assert sum(batch_sizes) == 18 and max(batch_sizes) == 4
    assert_each_step_ran_once(runs)


@pytest.mark.django_db
def test_a_lone_chain_goes_one_step_at_a_time(settings, batch_sizes):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 4)
    run = engine.open_run("line").run
    assert worker.work() == 4
    assert batch_sizes == [1, 1, 1, 1]
    started = list(Checkpoint.objects.filter(run=run, kind="step_started").order_by("seq")
                   .values_list("step__key", flat=True))
    assert started == ["s0", "s1", "s2", "s3"]
    assert_each_step_ran_once([run])


@pytest.mark.django_db
def test_a_refused_result_fails_only_its_own_step(settings):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("fine", 1)
    chain("bad", 1, {"callable": "tests.callables.not_a_number"})
    fine, bad = engine.open_run("fine").run, engine.open_run("bad").run
    assert worker.work() == 2
    fine.refresh_from_db()
    bad.refresh_from_db()
    assert fine.status == "completed"
    assert bad.status == "failed"
    assert bad.steps.get().last_summary.startswith("Result refused: state_patch.ratio")


@pytest.mark.django_db
def test_a_result_whose_lease_moved_on_in_the_batch_is_noted_stale(settings, monkeypatch):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 1)
    first, second = engine.open_run("line").run, engine.open_run("line").run

    def expire_second():  # as the sweeper would once the second step's lease ran out
        step = Step.objects.get(run=second)
        Step.objects.filter(pk=step.pk).update(lease_expires_at=step.started_at)
        engine.expire_lease(step.pk, why="lease ran out")

    before_attempting(monkeypatch, second, expire_second)  # its turn came: it began
    worker.work()
    kinds = list(Checkpoint.objects.filter(run=second).order_by("seq")
                 .values_list("kind", flat=True))
    # The attempt's result came after its lease was taken back: noted, not taken as the
    # step's (the step failed with its lease, having no retries); its neighbour completed.
    assert "stale_result" in kinds and "step_completed" not in kinds
    assert Run.objects.get(pk=second.pk).status == "failed"
    assert Run.objects.get(pk=first.pk).status == "completed"


@pytest.mark.django_db
def test_a_step_taken_back_before_its_turn_never_begins_and_runs_once_later(settings,
                                                                            monkeypatch):
    """The second step of a batch waits its turn while the first runs; its lease runs out
    and the sweeper gives it back unspent (the database knows it never began). When its
    turn comes the worker finds it is no longer its own and does not begin it; it runs
    once, later, as a fresh claim."""
    from workflows.recovery import sweeper

    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 1)
    first, second = engine.open_run("line").run, engine.open_run("line").run

    def lease_of_second_runs_out():
        Step.objects.filter(run=second).update(lease_expires_at=timezone.now())
        assert sweeper.sweep().released == 1

    before_attempting(monkeypatch, first, lease_of_second_runs_out)
    worker.work()
    kinds = list(Checkpoint.objects.filter(run=second).order_by("seq")
                 .values_list("kind", flat=True))
    assert kinds == ["run_opened", "step_started", "step_released", "step_started",
                     "step_completed"], kinds
    step = Step.objects.get(run=second)
    assert step.attempt - step.attempt_base == 1  # one attempt spent, the one that ran
    assert Run.objects.get(pk=first.pk).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_finished_step_is_recorded_while_a_slow_neighbour_runs(settings):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    settings.TOLLGATE_GROUP_COMMIT_HOLD_SECONDS = 0.005
    chain("quick", 1)
    chain("slow", 1, {"callable": "tests.callables.wait_for_neighbour"})
    engine.open_run("quick")
    slow = engine.open_run("slow").run
    assert worker.work() == 2
    slow.refresh_from_db()
    # The slow step waited for the quick one's result to be recorded: it was, by the
    # group's watcher, while the slow step still ran in the same batch.
    assert slow.shared_state == {"neighbour_recorded_first": True}


@pytest.mark.django_db(transaction=True)
def test_workers_in_group_commits_run_each_step_once(settings):
    """Several worker threads claiming and recording batches of the same runs at once."""
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 4
    store_spec({"name": "wide", "steps": [
        {"key": f"s{i}", "run": NOOP, **({"depends_on": ["s0"]} if i else {})}
        for i in range(4)]})
    runs = [engine.open_run("wide").run for _ in range(12)]
    barrier = threading.Barrier(3)

    def work(_):
        try:
            barrier.wait()
            return worker.work()
        finally:
            connection.close()

    with ThreadPoolExecutor(3) as pool:
        ran = sum(pool.map(work, range(3)))
    while worker.work():  # anything a thread left when its time ran out
        pass
    assert ran <= 48
    assert set(Run.objects.values_list("status", flat=True)) == {"completed"}
    assert_each_step_ran_once(runs)


@pytest.mark.django_db
def test_a_batch_cut_short_records_what_finished_and_gives_back_the_rest(settings,
                                                                         monkeypatch):
    """The database goes away before the second step of the batch begins: the first is
    recorded, the second and third (claimed, never begun) are given back with no attempt
    spent, so a step with no retries still runs."""
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 1)
    first, second, third = (engine.open_run("line").run for _ in range(3))
    real = worker.origin

    def away(run):
        if run.pk == second.pk:
            raise DatabaseError("the database went away")
        return real(run)

    monkeypatch.setattr(worker, "origin", away)
    with pytest.raises(DatabaseError):
        worker.work()
    assert Run.objects.get(pk=first.pk).status == "completed"
    for run in (second, third):
        step = Step.objects.get(run=run)
        assert (step.status, step.lease_token) == ("retrying", "")
        assert step.attempt - step.attempt_base - 1 == -1  # no retry spent
        assert Checkpoint.objects.filter(step=step, kind="step_released").count() == 1
    assert not worker.KEEPER.leases  # no lease of this batch is kept alive
    monkeypatch.setattr(worker, "origin", real)
    worker.work()  # the database is back: both run, with no retries left to spend
    assert set(Run.objects.values_list("status", flat=True)) == {"completed"}


@pytest.mark.django_db
def test_a_step_whose_lease_was_let_go_while_it_waited_is_given_back_saying_so(settings,
                                                                             monkeypatch):
    """Its worker could not keep the second step's lease while the first ran (the database
    away past the lease): the worker lets go of it, and gives it back saying so."""
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 1)
    first, second = (engine.open_run("line").run for _ in range(2))
    real, lost = worker.KEEPER.fresh, [Step.objects.get(run=second).pk]

    def fresh(kind, pk):  # the second step's lease, once: then all is well again
        if pk in lost:
            lost.remove(pk)
            return False
        return real(kind, pk)

    monkeypatch.setattr(worker.KEEPER, "fresh", fresh)
    worker.work()
    note = Checkpoint.objects.get(run=second, kind="step_released")
    assert "its worker let go of it before its turn" in note.summary
    assert "no attempt spent" in note.summary
    assert Run.objects.get(pk=first.pk).status == "completed"


@pytest.mark.django_db
def test_a_step_given_back_is_left_alone_once_its_lease_moved_on(settings):
    chain("one", 1)
    run = engine.open_run("one").run
    step = engine.claim_next(owner="w1", lease_seconds=30)
    token = step.lease_token
    engine.release_unstarted({step.pk: "someone else's"}, actor="worker w1")
    assert Step.objects.get(pk=step.pk).status == "running"  # not its token: untouched
    engine.release_unstarted({step.pk: token}, actor="worker w1")
    engine.release_unstarted({step.pk: token}, actor="worker w1")  # once only
    assert Checkpoint.objects.filter(run=run, kind="step_released").count() == 1


@pytest.mark.django_db
def test_a_run_cancelled_in_the_middle_of_a_batch_does_not_cost_the_others(
        settings, monkeypatch, people):
    settings.TOLLGATE_GROUP_COMMIT_STEPS = 8
    chain("line", 1)
    cancelled, kept = engine.open_run("line").run, engine.open_run("line").run
    before_attempting(monkeypatch, kept, lambda: engine.cancel_run(
        cancelled, actor=people["alice"], reason="not needed"))
    assert worker.work() == 2
    assert Run.objects.get(pk=cancelled.pk).status == "cancelled"
    assert Run.objects.get(pk=kept.pk).status == "completed"
    assert not worker.KEEPER.leases


@pytest.mark.django_db(transaction=True)
def test_a_claim_answered_too_late_renews_its_lease_before_its_attempt_begins(settings):
    """A claim whose answer came late (its connection hung through a network partition):
    this process can no longer tell its lease is alive, so it renews it before it begins.
    (Committed, as a worker's claim is: the lease keeper renews it on its own connection.)"""
    import time

    chain("late", 1, run={"shell": "sleep 0.2"})  # a command: its supervisor keeps the fence
    run = engine.open_run("late").run
    step = engine.claim_next(owner="w1", lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
    step.claimed_since = time.monotonic() - settings.TOLLGATE_LEASE_SECONDS  # asked long ago
    assert worker._execute(step, "w1", 0) == ["step_completed"]
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert Step.objects.get(run=run).attempt == 1


@pytest.mark.django_db
def test_a_claim_answered_after_its_lease_moved_on_never_begins(settings, monkeypatch):
    import time

    chain("lost", 1)
    engine.open_run("lost")
    step = engine.claim_next(owner="w1", lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
    step.claimed_since = time.monotonic() - settings.TOLLGATE_LEASE_SECONDS
    Step.objects.filter(pk=step.pk).update(lease_token="the sweeper's")  # taken back meanwhile
    monkeypatch.setattr(worker, "_attempt", lambda *a, **k: pytest.fail("it began"))
    assert worker._execute(step, "w1", 0) == ["not_begun"]
    assert Step.objects.get(pk=step.pk).lease_token == "the sweeper's"  # left to its holder
    assert not worker.KEEPER.leases


def test_a_lease_keeper_hung_on_a_dead_connection_is_replaced_for_new_leases(monkeypatch):
    """A renewal hung on a connection cut off by a partition must not starve the leases
    claimed, on other connections, once the network is back."""
    import time

    keeper = worker.LeaseKeeper()
    hung, renewed, beaters = threading.Event(), [], []

    def renew_leases(tokens, seconds):
        if not beaters:
            beaters.append(threading.current_thread())
            hung.set()
            time.sleep(30)  # the dead connection; the thread is a daemon
        renewed.extend(tokens)
        return set(tokens)

    monkeypatch.setattr(engine, "renew_leases", renew_leases)
    monkeypatch.setattr(worker.connection, "close", lambda: None)
    try:
        keeper.hold("step", 1, "t1", 0.3)
        assert hung.wait(patience())
        time.sleep(0.2)  # hung for more than a third of a lease
        keeper.hold("step", 2, "t2", 0.3)
        assert keeper.thread is not beaters[0]
        wait_for(lambda: 2 in renewed, interval=0.01, what="the new lease renewed")
        assert not keeper.leases[("step", 2)].stop.is_set()
    finally:
        keeper.close(timeout=patience())

"""Fair claims: which step a worker takes next, across runs, priorities and max_parallel."""

from __future__ import annotations

import pytest
from django.utils import timezone

from workflows import engine
from workflows.models import Run, Step
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError
from workflows.workers import worker

from .helpers import status

pytestmark = pytest.mark.django_db

NOOP = {"callable": "workflows.callables.noop"}


def fan_out(name: str, width: int, **top) -> str:
    store_spec({"name": name, **top, "steps": [{"key": f"s{i}", "run": NOOP}
                                               for i in range(width)]})
    return name


def chain(name: str, length: int) -> str:
    store_spec({"name": name, "steps": [
        {"key": f"s{i}", "run": NOOP, **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(length)]})
    return name


def claim():
    return engine.claim_next(owner="w", lease_seconds=30)


def finish(step, chain_on: bool = False):
    offer = engine.Chain("w", 30) if chain_on else None
    return engine.complete_step(step.run_id, step.key, lease_token=step.lease_token,
                                chain=offer)


def test_claims_serve_the_highest_priority_first():
    fan_out("work", 1)
    normal = engine.open_run("work").run
    high = engine.open_run("work", priority="high").run
    low = engine.open_run("work", priority="low").run
    assert [claim().run_id for _ in range(3)] == [high.pk, normal.pk, low.pk]
    assert claim() is None


def test_runs_of_one_priority_take_turns():
    fan_out("wide", 3)
    first, second = engine.open_run("wide").run, engine.open_run("wide").run
    served = []
    for _ in range(6):
        step = claim()
        served.append(step.run_id)
        finish(step)
    assert served == [first.pk, second.pk] * 3
    assert status(first)["run"] == status(second)["run"] == "completed"


def test_a_worker_goes_on_with_its_run_unless_another_waits_longer():
    chain("line", 4)
    run = engine.open_run("line").run
    step = claim()
    nxt = finish(step, chain_on=True).next_step
    assert (nxt.run_id, nxt.key, nxt.status) == (run.pk, "s1", "running")
    other = engine.open_run("line").run  # waits for a worker from now on
    # `run` was last served before `other` came: it goes on once more, then takes its turn.
    nxt = finish(nxt, chain_on=True).next_step
    assert (nxt.run_id, nxt.key) == (run.pk, "s2")
    # The worker goes on with the run that waited longer, in the completion's transaction.
    completed = finish(nxt, chain_on=True)
    taken = completed.next_step
    assert (taken.run_id, taken.key, taken.status) == (other.pk, "s0", "running")
    assert Step.objects.get(pk=taken.pk).status == "running"
    assert Run.objects.get(pk=run.pk).claimable_at is not None  # s3 is still there for later
    assert claim().run_id == run.pk  # and `run` is served next, as its turn comes


def test_max_parallel_caps_the_steps_a_run_runs_at_once():
    fan_out("capped", 4, max_parallel=2)
    run = engine.open_run("capped").run
    first, second = claim(), claim()
    assert claim() is None  # at its cap: nothing to claim
    assert Run.objects.get(pk=run.pk).claimable_at is None
    with pytest.raises(engine.IllegalTransition, match="max_parallel"):
        engine.start_step(run, "s2")
    nxt = finish(first, chain_on=True).next_step  # a slot frees: the worker takes it
    assert nxt.key == "s2"
    finish(second)
    assert claim().key == "s3"


def test_max_parallel_is_validated_in_the_spec():
    for value, problem in ((0, "greater than 0"), ("2", "an integer"), (True, "an integer"),
                           (10001, "at most 10000")):
        with pytest.raises(SpecError, match=f"spec: max_parallel must be .*{problem}|"
                                            f"spec: max_parallel {problem}"):
            store_spec({"name": "bad", "max_parallel": value, "steps": [
                {"key": "a", "run": NOOP}]})


def test_an_unknown_priority_is_refused_and_nothing_starts():
    fan_out("work", 1)
    with pytest.raises(engine.InvalidInput, match="priority must be one of"):
        engine.open_run("work", priority="urgent")
    assert not Run.objects.exists()


def test_a_new_run_is_served_before_a_long_fan_out_finishes():
    fan_out("big", 40)
    chain("small", 3)
    big = engine.open_run("big").run
    for _ in range(5):
        finish(claim())
    small = engine.open_run("small").run
    # Round robin by how long each has waited for a worker: `big` was last served before
    # `small` came, so it has one more turn; then `small`.
    assert [claim().run_id for _ in range(2)] == [big.pk, small.pk]


def test_a_stale_claim_time_is_put_right():
    fan_out("work", 1)
    run = engine.open_run("work").run
    Run.objects.filter(pk=run.pk).update(claimable_at=timezone.now())
    Step.objects.filter(run=run).update(status="skipped")  # as if moved on elsewhere
    assert claim() is None
    assert Run.objects.get(pk=run.pk).claimable_at is None


def test_work_runs_steps_across_runs_until_none_is_left():
    chain("line", 4)
    fan_out("wide", 3)
    runs = [engine.open_run("line").run, engine.open_run("wide").run]
    assert worker.work() == 7
    assert [status(run)["run"] for run in runs] == ["completed", "completed"]


def test_work_yields_when_its_time_is_spent_and_rings_for_the_rest(monkeypatch):
    rung = []
    monkeypatch.setattr("workflows.delivery.dispatch.wake",
                        lambda count, priority=1: rung.append(count))
    chain("line", 3)
    run = engine.open_run("line").run
    assert worker.work(budget=0) == 0 and rung == [1]
    assert status(run)["s0"] == "pending"

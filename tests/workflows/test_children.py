"""Runs inside runs: a `workflow` step opens a child run, waits for it without a worker, and
ends as the child ends; cancelling the parent cancels the child."""

from __future__ import annotations

import pytest

from workflows import engine
from workflows.delivery import outbox
from workflows.engine import processes
from workflows.models import Checkpoint, OutboxMessage, Run, Step
from workflows.recovery.recover import recover_run
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec
from workflows.workers import worker

pytestmark = pytest.mark.django_db(transaction=True)

CHILD = {"name": "child", "params": [{"name": "version", "type": "string"}],
         "steps": [{"key": "build", "run": {"callable": "workflows.callables.noop"}},
                   {"key": "sign", "depends_on": ["build"]}]}


def parent_spec(**run):
    return store_spec({"name": "parent", "params": [{"name": "version", "type": "string"}],
                       "steps": [{"key": "sub", "max_retries": 1,
                                  "run": {"workflow": "child",
                                          "params": {"version": "{{ params.version }}"},
                                          **run}},
                                 {"key": "after", "depends_on": ["sub"],
                                  "run": {"callable": "workflows.callables.noop"}}]})[0]


def deliver_outbox() -> None:
    """What the consumer does after each commit: deliver the run links the outbox holds."""
    for pk in OutboxMessage.objects.filter(done_at__isnull=True).values_list("pk", flat=True):
        outbox.deliver(pk)


def work_all() -> None:
    for _ in range(10):
        if not worker.work(budget=5):
            deliver_outbox()
            if not worker.work(budget=5):
                return


@pytest.fixture
def family(people):
    store_spec(CHILD)
    return parent_spec(), people["alice"]


def child_of(run: Run) -> Run:
    return Run.objects.get(parent_step__run=run)


def test_a_child_that_completes_completes_its_step(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    sub = Step.objects.get(run=run, key="sub")
    child = child_of(run)
    assert sub.status == "running" and sub.child_run_id == child.pk and not sub.lease_token
    assert child.params == {"version": "2.1"} and child.requested_by == alice
    assert child.goal_id == run.goal_id
    engine.record_transition(child, "sign", actor=alice, step_status="completed",
                             state_patch={"signed": True})
    deliver_outbox()
    work_all()
    sub.refresh_from_db()
    run.refresh_from_db()
    assert sub.status == "completed" and run.status == "completed"
    assert sub.last_evidence["child_state"] == {"signed": True}
    kinds = list(Checkpoint.objects.filter(run=run, step=sub).values_list("kind", flat=True))
    assert "child_started" in kinds and "child_ended" in kinds


def test_a_child_that_fails_fails_its_step_after_a_new_child_for_the_retry(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    first = child_of(run)
    engine.record_transition(first, "sign", actor=alice, step_status="failed")
    deliver_outbox()
    Step.objects.filter(run=run, key="sub").update(retry_after=None)
    work_all()
    sub = Step.objects.get(run=run, key="sub")
    second = Run.objects.get(pk=sub.child_run_id)
    assert second.pk != first.pk and sub.status == "running" and sub.attempt == 2
    engine.record_transition(second, "sign", actor=alice, step_status="failed")
    deliver_outbox()
    run.refresh_from_db()
    sub.refresh_from_db()
    assert sub.status == "failed" and run.status == "failed"
    assert Run.objects.filter(parent_step=sub).count() == 2  # one child per attempt


def test_a_cancelled_child_fails_its_step_without_retry(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    engine.cancel_run(child_of(run), actor=alice, reason="not needed")
    deliver_outbox()
    sub = Step.objects.get(run=run, key="sub")
    assert sub.status == "failed" and "cancelled" in sub.last_summary


def test_cancelling_the_parent_cancels_the_child(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    child = child_of(run)
    engine.cancel_run(run, actor=alice, reason="release dropped")
    deliver_outbox()
    child.refresh_from_db()
    assert child.status == "cancelled" and f"Run {run.pk} cancelled it" in child.error


def test_skipping_the_waiting_step_cancels_the_child(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    engine.skip_step(run, "sub", actor=alice, reason="done by hand")
    deliver_outbox()
    assert child_of(run).status == "cancelled"


def test_a_worker_killed_while_starting_the_child_leaves_none_then_one(family, monkeypatch):
    """The claim is taken, the child is being opened, the worker dies before the commit:
    nothing of the child stays; the lease runs out and the retry opens exactly one."""
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())

    class Killed(BaseException):
        pass

    def die_before_commit(*args, **kwargs):
        raise Killed

    from workflows.engine import children

    monkeypatch.setattr(children, "commit", die_before_commit)
    with pytest.raises(Killed):
        worker._execute_one(step, "w", chain=False)
    monkeypatch.undo()
    assert Run.objects.filter(parent_step__run=run).count() == 0
    # Reported again with the same claim (a worker that lived): still one child.
    again = engine.children.start_child(run, "sub", lease_token=step.lease_token,
                                        actor="worker w")
    assert again.kind == "child_started"
    repeated = engine.children.start_child(run, "sub", lease_token=step.lease_token,
                                           actor="worker w")
    assert repeated.pk == again.pk  # the recorded start, not a second one
    assert Run.objects.filter(parent_step__run=run).count() == 1


def test_recover_ends_a_step_whose_childs_message_was_lost(family):
    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    engine.record_transition(child_of(run), "sign", actor=alice, step_status="completed")
    OutboxMessage.objects.all().delete()  # as if the message were never delivered
    [verdict] = recover_run(run, actor=alice)
    assert verdict.action.startswith("ended with its child run")
    assert Step.objects.get(run=run, key="sub").status == "completed"


def test_prune_keeps_a_child_its_parent_has_not_heard_of(family, tmp_path):
    """The child ended, but its message to the parent is still owed: a prune takes it only
    once the parent's step has settled, and the parent completes from it meanwhile."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.ops import retention

    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    child = child_of(run)
    engine.record_transition(child, "sign", actor=alice, step_status="completed")
    Run.objects.filter(pk=child.pk).update(finished_at=timezone.now() - timedelta(days=200))
    assert Run.objects.get(pk=child.pk).status == "completed"
    with open(tmp_path / "out.jsonl", "w") as out:
        assert retention.prune_runs(90, out) == 0
    assert retention.finished_runs(90).count() == 0
    deliver_outbox()
    work_all()
    assert Run.objects.get(pk=run.pk).status == "completed"
    with open(tmp_path / "out.jsonl", "w") as out:
        assert retention.prune_runs(90, out) == 1  # settled: the child goes now
    assert not Run.objects.filter(pk=child.pk).exists()


def test_recover_ends_a_step_whose_child_run_is_gone(family):
    """A child deleted while its parent waited (by hand, or an older prune): recover fails
    the step, retried as after a failed child, instead of leaving it running for ever."""
    from workflows.ops import retention

    spec, alice = family
    run = engine.open_run(spec, actor=alice, params={"version": "2.1"}).run
    work_all()
    child = child_of(run)
    engine.cancel_run(child, actor=alice)
    OutboxMessage.objects.all().delete()  # the parent never hears
    retention._delete_runs([child.pk])
    sub = Step.objects.get(run=run, key="sub")
    assert sub.status == "running" and sub.child_run_id is None
    [verdict] = recover_run(run, actor=alice)
    assert verdict.action == "failed: its child run is gone"
    sub.refresh_from_db()
    assert sub.status == "retrying" and "gone" in sub.last_summary


def test_a_missing_child_spec_fails_the_step_saying_why(people):
    spec = parent_spec()
    run = engine.open_run(spec, actor=people["alice"], params={"version": "1"}).run
    work_all()
    sub = Step.objects.get(run=run, key="sub")
    assert sub.status == "failed" and "no active spec named 'child'" in sub.last_summary


def test_specs_refuse_a_bad_workflow_step():
    def refused(run, message):
        with pytest.raises(SpecError, match=message):
            validate_spec({"name": "p", "steps": [{"key": "a", "run": run}]})

    refused({"workflow": "c", "timeout_seconds": 3},
            "takes only workflow, params and on_parent_failure")
    refused({"workflow": "no spaces"}, "workflow must be a spec name")
    refused({"workflow": "c", "params": [1]}, "params must be an object")
    refused({"workflow": "p"}, "cannot run itself")
    refused({"callable": "workflows.callables.noop", "params": {}},
            "params and on_parent_failure belong to a workflow")
    refused({"workflow": "c", "on_parent_failure": "ignore"},
            "on_parent_failure must be 'cancel'")
    with pytest.raises(SpecError, match="not a workflow"):
        validate_spec({"name": "p", "steps": [{"key": "a", "run": {"command": ["true"]},
                                               "compensation": {"workflow": "c"}}]})


def test_a_parent_that_fails_cancels_its_children_unless_its_spec_says_continue(people):
    store_spec(CHILD)
    for on_failure in ("cancel", "continue"):
        run_block = {"workflow": "child", "params": {"version": "1"}}
        if on_failure == "continue":
            run_block["on_parent_failure"] = "continue"
        spec = store_spec({"name": f"fan-{on_failure}", "steps": [
            {"key": "sub", "run": run_block},
            {"key": "check", "run": {"callable": "workflows.callables.noop"}}]})[0]
        run = engine.open_run(spec, actor=people["alice"]).run
        engine.start_step(run, "check")
        work_all()  # the child opens, builds, and waits for its report
        child = child_of(run)
        assert child.status in ("open", "running")
        engine.fail_step(run, "check", retryable=False, summary="checks are red")
        deliver_outbox()
        work_all()
        child.refresh_from_db()
        run.refresh_from_db()
        if on_failure == "cancel":
            assert child.status == "cancelled"
            assert f"Run {run.pk} failed: " in child.error
            assert run.status == "failed"
            assert run.steps.get(key="sub").status == "failed"
        else:  # the child goes on; the parent waits for it, then fails
            assert child.status not in ("cancelled", "failed", "completed")
            assert run.status == "running"


def test_cards_link_a_child_to_its_parent_and_a_parent_to_its_child(people, client):
    store_spec({"name": "vet", "steps": [{"key": "ok", "title": "Vet the vendor",
                                          "approval": {"group": "qa"}}]})
    spec = store_spec({"name": "buy", "steps": [
        {"key": "vetting", "title": "Vetting", "run": {"workflow": "vet"}},
        {"key": "pay", "title": "Pay", "depends_on": ["vetting"],
         "approval": {"group": "qa"}}]})[0]
    run = engine.open_run(spec, actor=people["alice"], title="Buy laptops").run
    work_all()
    child = child_of(run)
    assert child.title == f"Vetting, for run #{run.pk} Buy laptops"
    client.force_login(people["bob"])
    inbox = client.get("/").content.decode()
    assert f'part of <a href="/runs/{run.pk}/#step-vetting">run #{run.pk}, step vetting</a>' \
        in inbox
    engine.approve(child, "ok", user=people["bob"])
    deliver_outbox()
    work_all()
    inbox = client.get("/").content.decode()  # now the parent's gate, after the child
    assert f'<a href="/runs/{child.pk}/">ran run #{child.pk}</a>' in inbox

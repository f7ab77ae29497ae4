"""Every legal and illegal transition of the engine, on the release spec."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from goals.models import Goal
from workflows import engine
from workflows.engine import rows as engine_rows
from workflows.models import Approval, Checkpoint, Step
from workflows.reads.selectors import resume_state

from .helpers import kinds, seqs, status

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(release_spec, people):
    return engine.open_run(release_spec, actor=people["alice"], title="Release 1.0").run


def finish_build(run):
    engine.start_step(run, "build", actor="worker")
    engine.complete_step(run, "build", actor="worker", summary="built")


def approve_qa(run, people):
    engine.approve(run, "qa", user=people["bob"])
    engine.approve(run, "qa", user=people["carol"])


class TestOpenRun:
    def test_opens_with_pending_steps_and_one_checkpoint(self, run, people):
        assert status(run) == {"run": "open", "build": "pending", "qa": "pending",
                               "deploy": "pending", "notify": "pending"}
        assert kinds(run) == ["run_opened"]
        assert run.requested_by == people["alice"]
        assert run.spec_name == "release"

    def test_by_name_uses_active_version(self, release_spec):
        opened = engine.open_run("release", shared_state={"x": 1})
        assert opened.run.spec == release_spec and opened.run.shared_state == {"x": 1}

    def test_unknown_spec(self, db):
        with pytest.raises(engine.NotFound, match="No active spec named 'nope'"):
            engine.open_run("nope")

    def test_idempotency_key_reuses_open_run(self, release_spec):
        first = engine.open_run(release_spec, idempotency_key="k1")
        again = engine.open_run(release_spec, idempotency_key="k1")
        assert not first.reused and again.reused and again.run.pk == first.run.pk

    def test_key_is_free_again_once_run_closes(self, release_spec):
        first = engine.open_run(release_spec, idempotency_key="k1").run
        engine.cancel_run(first)
        second = engine.open_run(release_spec, idempotency_key="k1")
        assert not second.reused and second.run.pk != first.pk

    def test_closed_goal_refuses_runs(self, release_spec):
        goal = Goal.objects.create(title="Old", status="completed")
        with pytest.raises(engine.IllegalTransition, match="closed goal"):
            engine.open_run(release_spec, goal=goal)

    def test_unknown_goal(self, release_spec):
        with pytest.raises(engine.NotFound, match="Goal 999 does not exist"):
            engine.open_run(release_spec, goal=999)

    def test_shared_state_must_be_object(self, release_spec):
        with pytest.raises(engine.InvalidInput):
            engine.open_run(release_spec, shared_state=[1, 2])


class TestReadySet:
    def test_dependencies_gate_readiness(self, run):
        steps = {s.key: s for s in run.steps.all()}
        assert [s.key for s in engine.ready_steps(run, steps.values())] == ["build"]

    @pytest.fixture
    def settled_failure(self, db):
        """A run whose step a failed with continue_on_failure, so its dependant b may go on."""
        from workflows.specs.storage import store_spec

        spec = store_spec({"name": "cof", "steps": [
            {"key": "a", "run": {"command": ["true"]}, "continue_on_failure": True},
            {"key": "b", "depends_on": ["a"], "run": {"command": ["true"]}},
        ]})[0]
        run = engine.open_run(spec).run
        engine.start_step(run, "a")
        engine.fail_step(run, "a", summary="boom")
        return run

    def test_continue_on_failure_counts_as_settled(self, settled_failure):
        run = settled_failure
        assert status(run) == {"run": "running", "a": "failed", "b": "pending"}
        steps = {s.key: s for s in run.steps.all()}
        assert [s.key for s in engine.ready_steps(run, steps.values())] == ["b"]

    def test_retrying_a_settled_failure_holds_its_dependants_back_again(self, settled_failure):
        run = settled_failure
        engine.retry_step(run, "a")
        with pytest.raises(engine.IllegalTransition, match="waiting on its dependencies"):
            engine.start_step(run, "b")
        engine.start_step(run, "a")
        engine.complete_step(run, "a")
        engine.start_step(run, "b")
        engine.complete_step(run, "b")
        assert status(run) == {"run": "completed", "a": "completed", "b": "completed"}

    def test_wide_fan_in_waits_for_every_branch(self, db):
        from workflows.specs.storage import store_spec

        branches = [f"p{i}" for i in range(30)]
        spec = store_spec({"name": "fan-in", "steps": [
            *({"key": key, "run": {"command": ["true"]}} for key in branches),
            {"key": "join", "depends_on": branches, "approval": {"group": "qa"}},
        ]})[0]
        run = engine.open_run(spec).run
        for key in branches:
            assert status(run)["join"] == "pending"
            engine.start_step(run, key)
            engine.complete_step(run, key)
        assert status(run)["join"] == "waiting_approval"
        assert Step.objects.get(run=run, key="join").waiting_on == 0

    def test_skipped_dependency_counts_as_settled(self, run, people):
        engine.skip_step(run, "build", actor=people["alice"], reason="prebuilt")
        assert status(run)["qa"] == "waiting_approval"


class TestStartAndFinish:
    def test_start_takes_lease(self, run):
        step = engine.start_step(run, "build", owner="w1", lease_seconds=30)
        assert step.status == "running" and step.attempt == 1 and step.lease_token
        assert step.lease_expires_at > timezone.now()
        assert status(run)["run"] == "running"

    def test_cannot_start_step_waiting_on_dependencies(self, run):
        with pytest.raises(engine.IllegalTransition, match="waiting on its dependencies"):
            engine.start_step(run, "deploy")
        assert seqs(run) == [1]

    def test_cannot_start_running_step_twice(self, run):
        engine.start_step(run, "build")
        with pytest.raises(engine.IllegalTransition, match="it is running"):
            engine.start_step(run, "build")

    def test_cannot_start_a_gate(self, run):
        finish_build(run)
        with pytest.raises(engine.IllegalTransition, match="approval gate"):
            engine.start_step(run, "qa")

    def test_complete_opens_next_gate_in_same_checkpoint(self, run):
        finish_build(run)
        assert status(run)["qa"] == "waiting_approval"
        last = Checkpoint.objects.filter(run=run).last()
        assert last.kind == "step_completed" and last.evidence["gates_opened"] == ["qa"]
        assert last.run_status == "waiting_approval" and last.step_status == "completed"

    def test_complete_merges_state_patch(self, run):
        engine.start_step(run, "build")
        engine.complete_step(run, "build", state_patch={"artifact": "a.tgz"})
        run.refresh_from_db()
        assert run.shared_state == {"artifact": "a.tgz"}

    def test_cannot_complete_pending_step(self, run):
        with pytest.raises(engine.IllegalTransition, match="Cannot complete build: it is pending"):
            engine.complete_step(run, "build")

    def test_cannot_complete_twice(self, run):
        finish_build(run)
        with pytest.raises(engine.IllegalTransition, match="it is completed"):
            engine.complete_step(run, "build")
        assert kinds(run).count("step_completed") == 1

    def test_unknown_step(self, run):
        with pytest.raises(engine.NotFound, match="no step 'nope'"):
            engine.start_step(run, "nope")

    def test_unknown_run(self, db):
        with pytest.raises(engine.NotFound):
            engine.start_step(424242, "build")


class TestFailureAndRetry:
    def test_failure_with_retries_left_retries(self, run):
        engine.start_step(run, "build")
        engine.fail_step(run, "build", summary="flaky")
        assert status(run)["build"] == "retrying"
        assert status(run)["run"] == "running"

    def test_retry_not_due_cannot_start(self, run):
        step = Step.objects.get(run=run, key="build")
        Step.objects.filter(pk=step.pk).update(retry_backoff_seconds=60)
        engine.start_step(run, "build")
        engine.fail_step(run, "build")
        with pytest.raises(engine.IllegalTransition, match="retries at"):
            engine.start_step(run, "build")

    def test_failure_without_retries_fails_run(self, run):
        engine.start_step(run, "build")
        engine.fail_step(run, "build", summary="flaky")
        engine.start_step(run, "build")
        engine.fail_step(run, "build", summary="broken")
        assert status(run)["build"] == "failed"
        run.refresh_from_db()
        assert run.status == "failed" and run.finished_at and "broken" in run.error

    def test_not_retryable_fails_at_once(self, run):
        engine.start_step(run, "build")
        engine.fail_step(run, "build", retryable=False)
        assert status(run)["run"] == "failed"

    def test_manual_retry_resets_attempt_window(self, run):
        for _ in range(2):
            engine.start_step(run, "build")
            engine.fail_step(run, "build")
        engine.retry_step(run, "build", actor="ops")
        assert status(run) == {"run": "running", "build": "pending", "qa": "pending",
                               "deploy": "pending", "notify": "pending"}
        run.refresh_from_db()
        assert run.finished_at is None and run.error == ""
        step = engine.start_step(run, "build")
        assert step.attempt == 3
        engine.fail_step(run, "build")
        assert status(run)["build"] == "retrying"  # a fresh automatic retry

    def test_cannot_retry_running_step(self, run):
        engine.start_step(run, "build")
        with pytest.raises(engine.IllegalTransition, match="only a failed step"):
            engine.retry_step(run, "build")

    def test_exponential_backoff_is_capped_with_jitter(self, run):
        step = Step.objects.get(run=run, key="build")
        step.retry_backoff_seconds = 10
        step.config = {**step.config, "retry_backoff": "exponential",
                       "retry_backoff_max_seconds": 25}
        delays = [engine.retry_delay(step, n) for n in (1, 2, 3, 4)]
        assert 5 <= delays[0] <= 10 and 10 <= delays[1] <= 20
        assert all(12.5 <= d <= 25 for d in delays[2:])


class TestApprovals:
    def test_quorum_of_distinct_approvers(self, run, people):
        finish_build(run)
        engine.approve(run, "qa", user=people["bob"], comment="ok")
        assert status(run)["qa"] == "waiting_approval"
        engine.approve(run, "qa", user=people["carol"])
        assert status(run)["qa"] == "completed"
        assert kinds(run)[-2:] == ["approval_recorded", "step_approved"]

    def test_same_user_twice_counts_once(self, run, people):
        finish_build(run)
        engine.approve(run, "qa", user=people["bob"])
        with pytest.raises(engine.IllegalTransition, match="already decided"):
            engine.approve(run, "qa", user=people["bob"])
        assert Approval.objects.filter(step__run=run).count() == 1
        assert status(run)["qa"] == "waiting_approval"

    def test_outsider_cannot_approve(self, run, people):
        finish_build(run)
        with pytest.raises(engine.NotPermitted, match="not in the 'qa' group"):
            engine.approve(run, "qa", user=people["erin"])

    def test_requester_cannot_approve_own_run(self, release_spec, people):
        run = engine.open_run(release_spec, actor=people["bob"]).run
        finish_build(run)
        with pytest.raises(engine.NotPermitted, match="requested run"):
            engine.approve(run, "qa", user=people["bob"])

    def test_requester_may_approve_when_spec_allows(self, db, people):
        from workflows.specs.storage import store_spec

        spec = store_spec({"name": "self", "steps": [
            {"key": "ok", "approval": {"group": "qa", "allow_self_approval": True}}]})[0]
        run = engine.open_run(spec, actor=people["bob"]).run
        engine.approve(run, "ok", user=people["bob"])
        assert status(run) == {"run": "completed", "ok": "completed"}

    def test_cannot_approve_before_gate_opens(self, run, people):
        with pytest.raises(engine.IllegalTransition, match="not waiting for approval"):
            engine.approve(run, "qa", user=people["bob"])

    def test_cannot_approve_completed_gate(self, run, people):
        finish_build(run)
        approve_qa(run, people)
        with pytest.raises(engine.IllegalTransition, match="it is completed"):
            engine.approve(run, "qa", user=people["bob"])

    def test_cannot_approve_a_run_step(self, run, people):
        with pytest.raises(engine.IllegalTransition, match="not an approval gate"):
            engine.approve(run, "build", user=people["bob"])

    def test_reject_fails_gate_with_comment(self, run, people):
        finish_build(run)
        engine.reject(run, "qa", user=people["bob"], comment="Login is broken")
        run.refresh_from_db()
        assert status(run)["qa"] == "failed" and run.status == "failed"
        assert "Login is broken" in run.error

    def test_reject_needs_comment(self, run, people):
        finish_build(run)
        with pytest.raises(engine.InvalidInput, match="comment is required"):
            engine.reject(run, "qa", user=people["bob"], comment="  ")
        assert status(run)["qa"] == "waiting_approval"

    def test_retry_of_rejected_gate_asks_again(self, run, people):
        finish_build(run)
        engine.reject(run, "qa", user=people["bob"], comment="no")
        engine.retry_step(run, "qa", actor=people["alice"])
        assert status(run)["qa"] == "waiting_approval"
        approve_qa(run, people)  # bob may decide the new attempt
        assert status(run)["qa"] == "completed"


class TestCancelAndSkip:
    def test_cancel_closes_open_steps(self, run, people):
        finish_build(run)
        engine.cancel_run(run, actor=people["alice"], reason="not today")
        assert status(run) == {"run": "cancelled", "build": "completed", "qa": "cancelled",
                               "deploy": "cancelled", "notify": "cancelled"}

    def test_cancel_is_idempotent(self, run):
        engine.cancel_run(run)
        assert engine.cancel_run(run) is None
        assert kinds(run) == ["run_opened", "run_cancelled"]

    def test_nothing_moves_on_cancelled_run(self, run, people):
        engine.cancel_run(run)
        for call in (lambda: engine.start_step(run, "build"),
                     lambda: engine.retry_step(run, "build"),
                     lambda: engine.skip_step(run, "build", reason="r"),
                     lambda: engine.approve(run, "qa", user=people["bob"]),
                     lambda: engine.record_transition(run, "build", step_status="running")):
            with pytest.raises(engine.IllegalTransition, match="cancelled"):
                call()
        assert seqs(run) == [1, 2]

    def test_cannot_cancel_completed_run(self, run, people):
        finish_build(run)
        approve_qa(run, people)
        for key in ("deploy", "notify"):
            engine.start_step(run, key)
            engine.complete_step(run, key)
        assert status(run)["run"] == "completed"
        with pytest.raises(engine.IllegalTransition, match="run .* is completed"):
            engine.cancel_run(run)

    def test_a_running_step_is_skipped_and_its_late_result_is_stale(self, run):
        step = engine.start_step(run, "build", owner="w", lease_seconds=30)
        checkpoint = engine.skip_step(run, "build", reason="built by hand")
        assert checkpoint.evidence["stopped_attempt"] == {"attempt": 1, "owner": "w"}
        assert status(run)["build"] == "skipped" and status(run)["qa"] == "waiting_approval"
        assert engine.renew_leases({step.pk: step.lease_token}, 30) == set()  # worker stops
        late = engine.complete_step(run, "build", lease_token=step.lease_token)
        assert late.kind == "stale_result" and status(run)["build"] == "skipped"


AGENT_SPEC = {"name": "agent-work", "steps": [
    {"key": "build", "title": "Build", "run": {"callable": "workflows.callables.noop"}},
    {"key": "review", "title": "Agent review", "depends_on": ["build"]},
    {"key": "qa", "depends_on": ["review"], "approval": {"group": "qa"}},
]}


class TestRecordTransition:
    """/transition reports wait steps, the ones something outside performs."""

    @pytest.fixture
    def agent_run(self, db):
        from workflows.specs.storage import store_spec

        run = engine.open_run(store_spec(AGENT_SPEC)[0]).run
        finish_build(run)
        return run

    def test_agent_performs_a_wait_step(self, agent_run):
        run = agent_run
        engine.record_transition(run, "review", actor="agent", step_status="running",
                                 summary="reading")
        engine.record_transition(run, "review", actor="agent", summary="50%",
                                 state_patch={"progress": 50})
        engine.record_transition(run, "review", actor="agent", step_status="completed",
                                 evidence={"log": "ok"}, state_patch={"progress": 100})
        run.refresh_from_db()
        assert run.shared_state == {"progress": 100}
        assert status(run)["qa"] == "waiting_approval"
        assert kinds(run)[-3:] == ["transition", "transition", "transition"]
        assert run.steps.get(key="review").reported_by == "agent"

    def test_blocked_step_blocks_run(self, agent_run):
        run = agent_run
        engine.record_transition(run, "review", step_status="blocked", summary="no creds")
        run.refresh_from_db()
        assert run.status == "blocked" and "no creds" in run.next_action
        engine.record_transition(run, "review", step_status="running")
        assert status(run)["run"] == "running"

    def test_bad_status(self, agent_run):
        with pytest.raises(engine.InvalidInput, match="step_status must be one of"):
            engine.record_transition(agent_run, "review", step_status="done")

    def test_cannot_report_on_gate(self, run):
        with pytest.raises(engine.IllegalTransition, match="approvers decide it"):
            engine.record_transition(run, "qa", step_status="completed")

    @pytest.mark.parametrize("leased", [False, True])
    def test_cannot_report_on_a_worker_step_whoever_asks(self, run, people, leased):
        if leased:
            engine.start_step(run, "build", owner="w", lease_seconds=30)
        for actor in (None, "ci", people["alice"]):
            with pytest.raises(engine.IllegalTransition, match="is a worker step"):
                engine.record_transition(run, "build", actor=actor, step_status="completed",
                                         summary="scan passed", evidence={"exit_code": 0})
        assert status(run)["build"] == ("running" if leased else "pending")
        assert seqs(run) == ([1, 2] if leased else [1])

    def test_state_patch_must_be_object(self, agent_run):
        before = seqs(agent_run)
        with pytest.raises(engine.InvalidInput, match="state_patch"):
            engine.record_transition(agent_run, "review", step_status="running",
                                     state_patch=[1])
        assert seqs(agent_run) == before


class TestResume:
    def test_ready(self, run):
        assert resume_state(run) == {
            "resume_state": "ready", "can_resume": True, "next_step": "build",
            "message": "Build is ready to start."}

    def test_waiting_approval(self, run, people):
        finish_build(run)
        engine.approve(run, "qa", user=people["bob"])
        state = resume_state(run)
        assert state["resume_state"] == "waiting_approval" and state["next_step"] == "qa"
        assert "1 more approval" in state["message"]

    def test_retry_available(self, run):
        engine.start_step(run, "build")
        engine.fail_step(run, "build", retryable=False, summary="bad")
        state = resume_state(run)
        assert state["resume_state"] == "retry_available" and state["can_resume"]

    def test_running_and_terminal(self, run):
        engine.start_step(run, "build")
        assert resume_state(run)["resume_state"] == "running"
        engine.cancel_run(run)
        assert resume_state(run)["resume_state"] == "cancelled"
        assert not resume_state(run)["can_resume"]


class TestLeases:
    def test_stale_token_result_is_recorded_not_applied(self, run):
        first = engine.start_step(run, "build", owner="w1", lease_seconds=30)
        Step.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now()
                                                - timedelta(seconds=1))
        assert engine.expire_lease(first.pk).kind == "step_retrying"
        second = engine.start_step(run, "build", owner="w2", lease_seconds=30)
        checkpoint = engine.complete_step(run, "build", lease_token=first.lease_token)
        assert checkpoint.kind == "stale_result"
        assert status(run)["build"] == "running"
        engine.complete_step(run, "build", lease_token=second.lease_token)
        assert status(run)["build"] == "completed"

    @pytest.mark.parametrize("verb", ["complete", "fail"])
    def test_a_report_sent_again_after_it_committed_is_recognised(self, run, verb):
        """A worker whose connection dropped as its report committed sends it again: the
        step keeps the first, and nothing is recorded twice (no stale result)."""
        step = engine.start_step(run, "build", owner="w1", lease_seconds=30)
        report = (engine.complete_step if verb == "complete" else engine.fail_step)
        first = report(run, "build", lease_token=step.lease_token)
        again = report(run, "build", lease_token=step.lease_token)
        assert again.pk == first.pk
        assert not Checkpoint.objects.filter(run=run, kind="stale_result").exists()

    def test_renew_only_with_live_token(self, run):
        step = engine.start_step(run, "build", owner="w1", lease_seconds=30)
        assert engine.renew_leases({step.pk: step.lease_token}, 30) == {step.pk}
        assert engine.renew_leases({step.pk: "other"}, 30) == set()
        engine.cancel_run(run)
        assert engine.renew_leases({step.pk: step.lease_token}, 30) == set()

    def test_expire_ignores_live_lease(self, run):
        step = engine.start_step(run, "build", owner="w1", lease_seconds=30)
        assert engine.expire_lease(step.pk) is None


class TestCheckpoints:
    def test_append_only(self, run):
        checkpoint = Checkpoint.objects.get(run=run)
        with pytest.raises(TypeError):
            checkpoint.save()
        with pytest.raises(TypeError):
            checkpoint.delete()
        with pytest.raises(TypeError):
            Checkpoint.objects.filter(run=run).update(summary="x")

    def test_full_release_is_gapless(self, run, people):
        finish_build(run)
        approve_qa(run, people)
        for key in ("deploy", "notify"):
            engine.start_step(run, key)
            engine.complete_step(run, key)
        assert seqs(run) == list(range(1, 10))
        assert status(run)["run"] == "completed"


class TestTransitionCost:
    """A transition reads the step it acts on and the run's frontier, not every step: its
    cost does not grow with the run (the benchmark measures the time; this pins the work)."""

    @staticmethod
    def cost_of_next_step(chain_length: int, monkeypatch) -> list[tuple[int, int]]:
        """(queries, step rows read) for starting and completing a step deep in a chain."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from workflows.specs.storage import store_spec

        noop = {"callable": "workflows.callables.noop"}
        spec = store_spec({"name": f"chain-{chain_length}", "steps": [
            {"key": f"s{i}", "run": noop, **({"depends_on": [f"s{i - 1}"]} if i else {})}
            for i in range(chain_length)]})[0]
        run = engine.open_run(spec).run
        for i in range(chain_length - 2):
            engine.start_step(run, f"s{i}")
            engine.complete_step(run, f"s{i}")
        rows = []
        instance = engine_rows.STEP.instance

        def counted(row, offset=0):
            rows.append(row)
            return instance(row, offset)

        monkeypatch.setattr(engine_rows.STEP, "instance", counted)
        key, costs = f"s{chain_length - 2}", []
        for move in (lambda: engine.start_step(run, key),
                     lambda: engine.complete_step(run, key)):
            rows.clear()
            with CaptureQueriesContext(connection) as captured:
                move()
            costs.append((len(captured), len(rows)))
        monkeypatch.undo()
        return costs

    def test_a_transition_costs_the_same_in_a_long_run(self, db, monkeypatch):
        short = self.cost_of_next_step(4, monkeypatch)
        assert all(rows <= 3 for _, rows in short)
        assert self.cost_of_next_step(150, monkeypatch) == short

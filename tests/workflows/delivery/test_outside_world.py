"""Steps that wait on the outside world, and runs that grow while they run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.workflows.helpers import status
from workflows import engine
from workflows.models import ApiToken, Checkpoint, Step
from workflows.reads.selectors import resume_state
from workflows.recovery import sweeper
from workflows.specs.storage import store_spec
from workflows.timing import deadlines

pytestmark = pytest.mark.django_db


@pytest.fixture
def review(db):
    return store_spec({"name": "review", "steps": [
        {"key": "draft", "run": {"callable": "workflows.callables.noop"}},
        {"key": "agent", "title": "Agent review", "depends_on": ["draft"],
         "timeout_seconds": 60, "on_timeout": "skip"},
        {"key": "publish", "depends_on": ["agent"], "run": {"command": ["true"]}},
    ]})[0]


def finish(run, key):
    engine.start_step(run, key)
    engine.complete_step(run, key)


class TestWaitSteps:
    def test_a_wait_step_is_never_claimed_or_rung(self, review, settings):
        settings.TOLLGATE_DISPATCH = True
        run = engine.open_run(review).run
        finish(run, "draft")
        agent = Step.objects.get(run=run, key="agent")
        assert agent.kind == "wait" and agent.status == "pending" and agent.rung_at is None
        with pytest.raises(engine.IllegalTransition):
            engine.claim_step(agent.pk, owner="w", lease_seconds=30)
        Step.objects.filter(pk=agent.pk).update(updated_at=timezone.now() - timedelta(hours=1))
        assert sweeper.sweep(now=timezone.now() + timedelta(minutes=5)).rerung == 0
        run.refresh_from_db()
        assert run.next_action == "Agent review waits for a report"
        assert resume_state(run)["resume_state"] == "awaiting_report"

    def test_an_agent_reports_it_through_transition(self, review, people):
        run = engine.open_run(review, actor=people["alice"]).run
        finish(run, "draft")
        token = ApiToken.objects.issue(people["alice"])[1]
        api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        response = api.post(f"/api/runs/{run.pk}/transition", {
            "step": "agent", "step_status": "completed", "summary": "looks right",
            "state_patch": {"score": 9}}, content_type="application/json")
        assert response.status_code == 200
        assert status(run)["agent"] == "completed"
        assert Step.objects.get(run=run, key="agent").deadline_at is None
        assert run.steps.get(key="publish").status == "pending"

    def test_its_timeout_applies_the_outcome_the_spec_names(self, review):
        run = engine.open_run(review).run
        finish(run, "draft")
        agent = Step.objects.get(run=run, key="agent")
        assert agent.deadline_at - timezone.now() > timedelta(seconds=55)
        Step.objects.filter(pk=agent.pk).update(deadline_at=timezone.now())  # time passes
        assert deadlines.apply() == 1
        assert status(run)["agent"] == "skipped"
        assert Checkpoint.objects.filter(run=run, kind="wait_timed_out").exists()

    def test_transition_on_a_step_a_worker_holds_answers_409(self, review):
        run = engine.open_run(review).run
        draft = Step.objects.get(run=run, key="draft")
        engine.claim_step(draft.pk, owner="worker-1", lease_seconds=30)
        with pytest.raises(engine.IllegalTransition, match="is a worker step"):
            engine.record_transition(run, "draft", step_status="completed")


class TestRunsThatGrow:
    def test_steps_are_added_with_a_checkpoint_each(self, review, people):
        run = engine.open_run(review, actor=people["alice"]).run
        finish(run, "draft")
        checkpoints = engine.add_steps(run, [
            {"key": "legal", "title": "Legal sign-off", "depends_on": ["draft"],
             "approval": {"group": "qa"}},
            {"key": "tweet", "depends_on": ["legal"],
             "run": {"callable": "workflows.callables.noop"}},
        ], actor=people["alice"])
        assert [c.kind for c in checkpoints] == ["step_added", "step_added"]
        legal = Step.objects.get(run=run, key="legal")
        assert legal.status == "waiting_approval" and legal.added_by == "alice"
        assert Step.objects.get(run=run, key="tweet").waiting_on == 1
        assert "legal" in Step.objects.get(run=run, key="draft").dependents
        engine.approve(run, "legal", user=people["bob"])
        assert Step.objects.get(run=run, key="tweet").waiting_on == 0

    @pytest.mark.parametrize("items, message", [
        ([{"key": "draft", "run": {"command": ["true"]}}], "already has a step 'draft'"),
        ([{"key": "x", "depends_on": ["ghost"], "run": {"command": ["true"]}}],
         "unknown step 'ghost'"),
        ([{"key": "x/y", "run": {"command": ["true"]}}], "letters, digits"),
        ([], "non-empty list"),
    ])
    def test_bad_steps_change_nothing(self, review, items, message):
        run = engine.open_run(review).run
        before = Step.objects.filter(run=run).count()
        with pytest.raises(engine.InvalidInput, match=message):
            engine.add_steps(run, items)
        assert Step.objects.filter(run=run).count() == before

    def test_through_the_api_with_the_requesters_right(self, review, people):
        run = engine.open_run(review, actor=people["alice"]).run
        item = {"steps": [{"key": "extra", "run": {"callable": "workflows.callables.noop"}}]}
        carol = ApiToken.objects.issue(people["carol"])[1]
        refused = Client(HTTP_AUTHORIZATION=f"Bearer {carol}").post(
            f"/api/runs/{run.pk}/steps", item, content_type="application/json")
        assert refused.status_code == 403
        alice = ApiToken.objects.issue(people["alice"])[1]
        added = Client(HTTP_AUTHORIZATION=f"Bearer {alice}").post(
            f"/api/runs/{run.pk}/steps", item, content_type="application/json")
        assert added.status_code == 201
        assert "extra" in [s["key"] for s in added.json()["steps"]]

    def test_the_run_page_says_who_added_a_step(self, client, review, people):
        run = engine.open_run(review, actor=people["alice"]).run
        engine.add_steps(run, [{"key": "extra", "run": {"callable": "workflows.callables.noop"}}],
                         actor=people["alice"])
        client.force_login(people["dave"])
        body = client.get(f"/runs/{run.pk}/").content.decode()
        assert "added at run time by alice" in body and "waits for a report" in body


def test_skipping_the_failure_of_a_failed_run_moves_it_on(release_spec, people):
    run = engine.open_run(release_spec, actor=people["alice"]).run
    engine.start_step(run, "build")
    engine.fail_step(run, "build", retryable=False, summary="flaky")
    assert status(run)["run"] == "failed"
    engine.skip_step(run, "build", actor=people["alice"], reason="built by hand")
    assert status(run) == {"run": "waiting_approval", "build": "skipped",
                           "qa": "waiting_approval", "deploy": "pending", "notify": "pending"}

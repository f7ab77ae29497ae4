"""Every endpoint's happy path and each error status."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from goals.models import Goal
from tests.workflows.helpers import work
from workflows import engine
from workflows.models import ApiToken, Run

from ..conftest import RELEASE

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(api, release_spec):
    response = api["alice"].post("/api/runs", {"spec": "release", "title": "R1"})
    assert response.status_code == 201
    return Run.objects.get(pk=response.json()["id"])


def gate_open(run):
    work(run, "build")


class TestAuth:
    def test_no_credentials_is_401(self, db):
        response = Client().get("/api/runs")
        assert response.status_code == 401 and "error" in response.json()

    def test_wrong_token_is_401(self, db):
        client = Client(HTTP_AUTHORIZATION="Bearer tg_not-a-token")
        assert client.get("/api/runs").status_code == 401

    def test_revoked_token_is_401(self, api):
        ApiToken.objects.filter(user=api["bob"].user).update(revoked_at=timezone.now())
        assert api["bob"].get("/api/runs").status_code == 401

    def test_token_records_last_use_and_is_stored_hashed(self, api):
        assert api["bob"].get("/api/runs").status_code == 200
        token = ApiToken.objects.get(user=api["bob"].user)
        assert token.last_used_at is not None
        assert api["bob"].token not in (token.key_hash, token.prefix)

    def test_session_works_with_csrf(self, people, release_spec):
        client = Client(enforce_csrf_checks=True)
        client.force_login(people["dave"])
        assert client.get("/api/runs").status_code == 200
        assert client.post("/api/runs", {"spec": "release"},
                           content_type="application/json").status_code in (401, 403)

    def test_token_acts_with_its_users_permissions_only(self, api, run):
        gate_open(run)
        response = api["erin"].post(f"/api/runs/{run.pk}/steps/qa/approve")
        assert response.status_code == 403 and "not in the 'qa' group" in response.json()["error"]
        assert api["carol"].post("/api/runs", {"spec": "release"}).status_code == 403

    def test_other_users_run_cannot_be_reported_on(self, api, run):
        response = api["bob"].post(f"/api/runs/{run.pk}/transition",
                                   {"step": "build", "step_status": "running"})
        assert response.status_code == 403
        assert run.steps.get(key="build").status == "pending"


class TestSpecs:
    def test_create_and_new_version(self, api):
        assert api["alice"].post("/api/specs", RELEASE).json() == {"name": "release",
                                                                   "version": 1}
        changed = {**RELEASE, "description": "v2"}
        response = api["alice"].post("/api/specs", changed)
        assert response.status_code == 201 and response.json()["version"] == 2

    def test_invalid_spec_is_400_naming_the_step(self, api):
        bad = {"name": "x", "steps": [{"key": "a", "run": {"command": "ls"}}]}
        response = api["alice"].post("/api/specs", bad)
        assert response.status_code == 400
        assert response.json()["error"].startswith("step 'a' run: command must be a list")

    def test_needs_permission(self, api):
        assert api["bob"].post("/api/specs", RELEASE).status_code == 403


class TestGoals:
    def test_create_get_list_patch(self, api):
        response = api["alice"].post("/api/goals", {"title": "Ship", "owner": "alice",
                                                    "priority": "high"})
        assert response.status_code == 201
        goal = response.json()
        assert goal["owner"] == "alice" and goal["rollup"]["runs_open"] == 0
        child = api["alice"].post("/api/goals", {"title": "Child", "parent": goal["id"]}).json()
        # Who opened it is recorded, read back and shown on its page.
        assert child["opened_by"] == "alice" and child["owner"] is None
        assert api["bob"].get(f"/api/goals/{child['id']}").json()["opened_by"] == "alice"
        from django.test import Client

        page = Client()
        page.force_login(api["bob"].user)
        assert "by alice" in page.get(f"/goals/{child['id']}/").content.decode()
        assert api["bob"].get(f"/api/goals/{goal['id']}").json()["rollup"]["child_goals"] == 1
        roots = api["bob"].get("/api/goals", parent=0).json()
        assert [g["title"] for g in roots] == ["Ship"]
        patched = api["alice"].patch(f"/api/goals/{child['id']}",
                                     {"status": "blocked", "blocker_reason": "legal"})
        assert patched.status_code == 200 and patched.json()["blocker_reason"] == "legal"
        closed = api["alice"].patch(f"/api/goals/{child['id']}", {"status": "completed"})
        assert closed.json()["closed_at"] is not None and closed.json()["blocker_reason"] == ""

    def test_a_cycle_conflicts_with_the_tree_409(self, api):
        root = Goal.objects.create(title="Root")
        child = Goal.objects.create(title="Child", parent=root)
        response = api["alice"].patch(f"/api/goals/{root.pk}", {"parent": child.pk})
        assert response.status_code == 409 and "own ancestor" in response.json()["error"]

    def test_blocked_without_reason_is_400(self, api):
        response = api["alice"].post("/api/goals", {"title": "X", "status": "blocked"})
        assert response.status_code == 400 and "blocker reason" in response.json()["error"]
        assert not Goal.objects.exists()

    def test_bad_values(self, api):
        assert api["alice"].post("/api/goals", {"title": ""}).status_code == 400
        assert api["alice"].post("/api/goals", {"title": "x", "status": "nope"}).status_code == 400
        assert api["alice"].post("/api/goals", {"title": "x", "owner": "ghost"}).status_code == 400
        assert api["alice"].post("/api/goals", {"title": "x", "parent": 999}).status_code == 400
        assert api["bob"].get("/api/goals/999").status_code == 404
        assert api["bob"].post("/api/goals", {"title": "x"}).status_code == 403


class TestRuns:
    def test_start_returns_run_with_steps(self, api, release_spec):
        goal = Goal.objects.create(title="G")
        response = api["alice"].post("/api/runs", {"spec": "release", "goal": goal.pk,
                                                   "shared_state": {"branch": "main"}})
        body = response.json()
        assert response.status_code == 201 and body["reused_existing"] is False
        assert body["goal"] == goal.pk and body["requested_by"] == "alice"
        assert [s["key"] for s in body["steps"]] == ["build", "qa", "deploy", "notify"]

    def test_idempotent_start(self, api, release_spec):
        first = api["alice"].post("/api/runs", {"spec": "release", "idempotency_key": "k"})
        again = api["alice"].post("/api/runs", {"spec": "release", "idempotency_key": "k"})
        assert again.status_code == 200 and again.json()["reused_existing"] is True
        assert again.json()["id"] == first.json()["id"]

    @pytest.mark.parametrize(("body", "status", "message"), [
        ({"spec": "nope"}, 404, "No active spec named 'nope'"),
        ({"spec": "release", "goal": 999}, 404, "Goal 999 does not exist"),
        ({"spec": "release", "shared_state": [1]}, 400, "shared_state"),
        ({}, 400, "spec"),
        ({"spec": "release\u0000"}, 400, "NUL"),
    ])
    def test_start_errors(self, api, release_spec, body, status, message):
        response = api["alice"].post("/api/runs", body)
        assert response.status_code == status and message in response.json()["error"]
        assert not Run.objects.exists()

    def test_closed_goal_is_409(self, api, release_spec):
        goal = Goal.objects.create(title="Done", status="completed")
        response = api["alice"].post("/api/runs", {"spec": "release", "goal": goal.pk})
        assert response.status_code == 409

    def test_list_with_filters(self, api, run, release_spec):
        engine.cancel_run(run)
        api["alice"].post("/api/runs", {"spec": "release"})
        body = api["bob"].get("/api/runs", status="cancelled").json()
        assert body["count"] == 1 and body["results"][0]["id"] == run.pk
        assert api["bob"].get("/api/runs", spec="release").json()["count"] == 2
        assert api["bob"].get("/api/runs", status="nope").status_code == 400
        assert api["bob"].get("/api/runs", goal=123).json()["count"] == 0

    def test_detail_timeline_and_resume(self, api, run):
        detail = api["bob"].get(f"/api/runs/{run.pk}").json()
        assert detail["status"] == "open" and len(detail["steps"]) == 4
        timeline = api["bob"].get(f"/api/runs/{run.pk}/timeline").json()
        assert timeline[0]["seq"] == 1 and timeline[0]["kind"] == "run_opened"
        assert set(timeline[0]) == {"seq", "kind", "step", "actor", "at", "label", "summary",
                                    "run_status", "step_status", "evidence", "state_patch"}
        resume = api["bob"].get(f"/api/runs/{run.pk}/resume").json()
        assert resume == {"resume_state": "ready", "can_resume": True, "next_step": "build",
                          "message": "Build is ready to start."}
        assert api["bob"].get("/api/runs/999").status_code == 404
        assert api["bob"].get("/api/runs/999/timeline").status_code == 404
        assert api["bob"].get("/api/runs/999/resume").status_code == 404


@pytest.fixture
def agent_run(api, db):
    """A run whose first step waits for an agent's report."""
    from workflows.specs.storage import store_spec

    store_spec({"name": "reviewed", "steps": [
        {"key": "review", "title": "Agent review"},
        {"key": "qa", "depends_on": ["review"], "approval": {"group": "qa"}},
        {"key": "deploy", "depends_on": ["qa"], "run": {"callable": "workflows.callables.noop"}},
    ]})
    response = api["alice"].post("/api/runs", {"spec": "reviewed"})
    return Run.objects.get(pk=response.json()["id"])


class TestTransition:
    def test_agent_performs_a_wait_step(self, api, agent_run):
        agent = api["alice"]
        url = f"/api/runs/{agent_run.pk}/transition"
        assert agent.post(url, {"step": "review", "step_status": "running",
                                "summary": "reading"}).status_code == 200
        response = agent.post(url, {"step": "review", "step_status": "completed",
                                    "evidence": {"log": "ok"}, "state_patch": {"sha": "abc"}})
        body = response.json()
        assert body["checkpoint"]["kind"] == "transition"
        assert body["checkpoint"]["step"] == "review"
        assert body["checkpoint"]["actor"] == "alice"
        assert body["run"]["status"] == "waiting_approval"
        assert body["run"]["shared_state"] == {"sha": "abc"}
        assert agent.get(f"/api/runs/{agent_run.pk}/resume").json()["resume_state"] == \
            "waiting_approval"

    def test_errors(self, api, run, agent_run):
        agent = api["alice"]
        url = f"/api/runs/{agent_run.pk}/transition"
        assert agent.post(url, {"step": "nope", "step_status": "running"}).status_code == 404
        assert agent.post(url, {"step": "review", "step_status": "done"}).status_code == 400
        assert agent.post(url, {"step": "deploy", "step_status": "running"}).status_code == 409
        assert agent.post(url, {"step": "qa", "step_status": "completed"}).status_code == 409
        assert agent.post(url, {"step": "review", "state_patch": "x"}).status_code == 400
        worker_step = f"/api/runs/{run.pk}/transition"
        assert agent.post(worker_step, {"step": "build", "step_status": "completed"}
                          ).status_code == 409
        assert api["alice"].post("/api/runs/999/transition", {"step": "a"}).status_code == 404


class TestDecisionsAndControl:
    def test_approve_reject_retry_cancel(self, api, run):
        gate_open(run)
        response = api["bob"].post(f"/api/runs/{run.pk}/steps/qa/approve", {"comment": "ok"})
        assert response.status_code == 200
        assert api["bob"].post(f"/api/runs/{run.pk}/steps/qa/approve").status_code == 409
        rejected = api["carol"].post(f"/api/runs/{run.pk}/steps/qa/reject", {"comment": "no"})
        assert rejected.status_code == 200 and rejected.json()["status"] == "failed"
        assert api["bob"].post(f"/api/runs/{run.pk}/steps/qa/retry").status_code == 403
        retried = api["alice"].post(f"/api/runs/{run.pk}/steps/qa/retry")
        assert retried.status_code == 200 and retried.json()["status"] == "waiting_approval"
        cancelled = api["alice"].post(f"/api/runs/{run.pk}/cancel", {"reason": "done"})
        assert cancelled.json()["status"] == "cancelled"
        assert api["alice"].post(f"/api/runs/{run.pk}/cancel").status_code == 200  # idempotent
        assert api["bob"].post(f"/api/runs/{run.pk}/steps/qa/approve").status_code == 409

    def test_reject_needs_comment(self, api, run):
        gate_open(run)
        response = api["bob"].post(f"/api/runs/{run.pk}/steps/qa/reject", {"comment": ""})
        assert response.status_code == 400 and "comment" in response.json()["error"]

    def test_cancel_needs_operator(self, api, run):
        assert api["bob"].post(f"/api/runs/{run.pk}/cancel").status_code == 403

    def test_unknown_step_is_404(self, api, run):
        assert api["bob"].post(f"/api/runs/{run.pk}/steps/zzz/approve").status_code == 404

    def test_malformed_json_is_400(self, api, run):
        response = api["alice"].client.post(f"/api/runs/{run.pk}/cancel", "{nope",
                                            content_type="application/json")
        assert response.status_code == 400 and "error" in json.loads(response.content)


def test_openapi_document(api):
    doc = api["bob"].get("/api/openapi.json").json()
    paths = doc["paths"]
    for path in ["/api/specs", "/api/goals", "/api/goals/{goal_id}", "/api/runs",
                 "/api/runs/{run_id}", "/api/runs/{run_id}/timeline",
                 "/api/runs/{run_id}/resume", "/api/runs/{run_id}/transition",
                 "/api/runs/{run_id}/cancel", "/api/runs/{run_id}/steps/{key}/approve",
                 "/api/runs/{run_id}/steps/{key}/reject", "/api/runs/{run_id}/steps/{key}/retry"]:
        assert path in paths, path


class TestListsAsTheRuntimesReadThem:
    """open=true, several statuses at once, and the timeline newest first in pages."""

    def test_runs_open_only_and_several_statuses(self, api, release_spec):
        from workflows import engine

        alice = api["alice"].user
        done = engine.open_run(release_spec, actor=alice).run
        engine.cancel_run(done, reason="not needed")
        waiting = engine.open_run(release_spec, actor=alice).run
        work(waiting, "build")
        fresh = engine.open_run(release_spec, actor=alice).run

        def ids(**params):
            return {r["id"] for r in api["alice"].get("/api/runs", **params).json()["results"]}

        assert ids(open="true") == {waiting.pk, fresh.pk}
        assert ids(status=["cancelled", "waiting_approval"]) == {done.pk, waiting.pk}
        assert ids() == {done.pk, waiting.pk, fresh.pk}
        assert api["alice"].get("/api/runs", status="nonsense").status_code == 400

    def test_goals_open_only_and_several_statuses(self, api):
        from goals.models import Goal

        active = Goal.objects.create(title="A")
        blocked = Goal.objects.create(title="B", status="blocked", blocker_reason="x")
        closed = Goal.objects.create(title="C")
        closed.status = "completed"
        closed.sync_status_fields()
        closed.save()

        def ids(**params):
            return {g["id"] for g in api["alice"].get("/api/goals", **params).json()}

        assert ids() == {active.pk, blocked.pk, closed.pk}  # every goal, as before
        assert ids(open="true") == {active.pk, blocked.pk}
        assert ids(status=["blocked", "completed"]) == {blocked.pk, closed.pk}

    def test_the_timeline_newest_first_with_a_limit_and_paging(self, api, run):
        work(run, "build")  # 3 checkpoints: opened, started, completed
        url = f"/api/runs/{run.pk}/timeline"
        assert [c["seq"] for c in api["alice"].get(url).json()] == [1, 2, 3]
        newest = api["alice"].get(url, order="newest", limit=2).json()
        assert [c["seq"] for c in newest] == [3, 2]
        older = api["alice"].get(url, order="newest", before=2).json()
        assert [c["seq"] for c in older] == [1]
        assert [c["seq"] for c in api["alice"].get(url, after=1, limit=1).json()] == [2]
        assert api["alice"].get(url, limit=0).status_code == 400


class TestReusePolicies:
    """What a key already used means: its open run, any run, or nothing (refused)."""

    def start(self, api, reuse, key="nightly-1"):
        return api["alice"].post("/api/runs", {"spec": "release", "idempotency_key": key,
                                              "reuse": reuse})

    def test_open_by_default_opens_anew_once_the_run_has_ended(self, api, release_spec):
        first = self.start(api, "open").json()["id"]
        Run.objects.filter(pk=first).update(status="completed")
        again = self.start(api, "open")
        assert again.status_code == 201 and again.json()["id"] != first

    def test_any_returns_the_run_whatever_its_status(self, api, release_spec):
        first = self.start(api, "any").json()["id"]
        Run.objects.filter(pk=first).update(status="completed")
        again = self.start(api, "any")
        assert again.status_code == 200 and again.json()["id"] == first
        assert again.json()["reused_existing"] is True

    def test_none_refuses_a_key_already_used(self, api, release_spec):
        first = self.start(api, "none").json()["id"]
        refused = self.start(api, "none")
        assert refused.status_code == 409 and str(first) in refused.json()["error"]
        Run.objects.filter(pk=first).update(status="cancelled")
        assert self.start(api, "none").status_code == 409
        assert Run.objects.count() == 1

    def test_the_command_takes_it_too(self, release_spec):
        import io

        from django.core.management import call_command

        out = io.StringIO()
        call_command("start_run", "release", "--idempotency-key", "k", stdout=out)
        Run.objects.update(status="failed")
        again = io.StringIO()
        call_command("start_run", "release", "--idempotency-key", "k", "--reuse", "any",
                     stdout=again, stderr=io.StringIO())
        assert again.getvalue() == out.getvalue()


def test_a_method_a_path_does_not_take_is_answered_in_json(client, people):
    from workflows.models import ApiToken

    token = ApiToken.objects.issue(people["alice"], "t")[1]
    response = client.get("/api/runs/1/cancel", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response.json() == {"error": "GET is not taken here: use POST."}

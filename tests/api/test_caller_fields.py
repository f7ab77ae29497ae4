"""What callers set on runs and transitions: next action, kind, outside reference, a label per
checkpoint, a blocker reason, replacing the shared state, inline steps, child runs."""

from __future__ import annotations

import pytest

from workflows.models import Checkpoint, Run, WorkflowSpec
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

AGENT_TASK = {"name": "agent-task", "steps": [{"key": "work"}, {"key": "review",
                                                                 "depends_on": ["work"]}]}


@pytest.fixture
def task(api):
    store_spec(AGENT_TASK)
    response = api["alice"].post("/api/runs", {
        "spec": "agent-task", "next_action": "pick up the ticket", "kind": "agent",
        "ref": "TICKET-42"})
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_run_opens_with_next_action_kind_and_ref_and_is_found_by_ref(api, task):
    assert (task["next_action"], task["kind"], task["ref"]) == (
        "pick up the ticket", "agent", "TICKET-42")
    store_spec({**AGENT_TASK, "name": "other"})
    api["alice"].post("/api/runs", {"spec": "other", "ref": "TICKET-7"})
    by_ref = api["alice"].get("/api/runs", ref="TICKET-42").json()
    assert [r["id"] for r in by_ref["results"]] == [task["id"]]
    assert api["alice"].get("/api/runs", q="ticket-4").json()["count"] == 1
    assert api["alice"].get("/api/runs", kind="agent").json()["count"] == 1


def test_a_transition_sets_next_action_label_and_blocker(api, task):
    url = f"/api/runs/{task['id']}/transition"
    response = api["alice"].post(url, {"step": "work", "step_status": "blocked",
                                       "blocker_reason": "waiting for credentials",
                                       "next_action": "ask ops for a token",
                                       "label": "blocked on creds"})
    assert response.status_code == 200, response.json()
    run = response.json()["run"]
    assert run["status"] == "blocked" and run["blocker_reason"] == "waiting for credentials"
    assert run["next_action"] == "ask ops for a token"
    assert response.json()["checkpoint"]["label"] == "blocked on creds"
    response = api["alice"].post(url, {"step": "work", "step_status": "completed",
                                       "next_action": ""})
    run = response.json()["run"]
    assert run["blocker_reason"] == "" and run["status"] != "blocked"
    assert run["next_action"] != "ask ops for a token"  # cleared: the engine's words again
    timeline = api["alice"].get(f"/api/runs/{task['id']}/timeline").json()
    reports = [c for c in timeline if c["kind"] == "transition"]
    assert sorted(c["label"] for c in reports) == ["blocked on creds", "completed"]
    assert {c["evidence"].get("next_action") for c in reports} == {"ask ops for a token", ""}


def test_a_blocker_reason_needs_a_blocked_step(api, task):
    response = api["alice"].post(f"/api/runs/{task['id']}/transition", {
        "step": "work", "step_status": "running", "blocker_reason": "why"})
    assert response.status_code == 400 and "blocker_reason" in response.json()["error"]
    assert Checkpoint.objects.filter(run_id=task["id"]).count() == 1  # nothing written


def test_shared_state_is_merged_or_replaced(api, task):
    url = f"/api/runs/{task['id']}/transition"
    api["alice"].post(url, {"step": "work", "step_status": "running",
                            "state_patch": {"a": 1, "b": 2}})
    merged = api["alice"].post(url, {"step": "work", "state_patch": {"b": 3}}).json()
    assert merged["run"]["shared_state"] == {"a": 1, "b": 3}
    replaced = api["alice"].post(url, {"step": "work", "state_patch": {"c": 4},
                                       "shared_state_mode": "replace"}).json()
    assert replaced["run"]["shared_state"] == {"c": 4}
    assert replaced["checkpoint"]["evidence"]["shared_state_replaced"] is True
    response = api["alice"].post(url, {"step": "work", "shared_state_mode": "replace"})
    assert response.status_code == 400 and "needs state_patch" in response.json()["error"]


def test_a_run_opens_with_inline_steps_as_a_one_off_spec_version(api, people):
    steps = [{"key": "draft"}, {"key": "send", "depends_on": ["draft"]}]
    first = api["alice"].post("/api/runs", {"spec": "adhoc", "steps": steps,
                                            "idempotency_key": "k1"})
    assert first.status_code == 201, first.json()
    again = api["alice"].post("/api/runs", {"spec": "adhoc", "steps": steps,
                                            "idempotency_key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    [spec] = WorkflowSpec.objects.filter(name="adhoc")
    assert spec.status == "one_off"  # never the active version
    assert [s["key"] for s in first.json()["steps"]] == ["draft", "send"]
    assert api["alice"].post("/api/runs", {"spec": "adhoc"}).status_code == 404


def test_inline_steps_are_validated_and_authorised_like_a_spec(api, people):
    bad = api["alice"].post("/api/runs", {"spec": "adhoc", "steps": [
        {"key": "a", "depends_on": ["nope"]}]})
    assert bad.status_code == 400 and "unknown step 'nope'" in bad.json()["error"]
    shell = api["bob"].post("/api/runs", {"spec": "adhoc", "steps": [
        {"key": "a", "run": {"shell": "rm -rf /"}}]})
    assert shell.status_code == 403
    assert not WorkflowSpec.objects.filter(name="adhoc").exists()
    assert not Run.objects.exists()


def test_a_child_run_names_its_parent_and_the_step_its_child(api, people):
    from tests.workflows.test_children import CHILD, parent_spec, work_all

    store_spec(CHILD)
    parent_spec()
    run = api["alice"].post("/api/runs", {"spec": "parent",
                                          "params": {"version": "3"}}).json()
    work_all()
    detail = api["alice"].get(f"/api/runs/{run['id']}").json()
    [sub] = [s for s in detail["steps"] if s["key"] == "sub"]
    child = api["alice"].get(f"/api/runs/{sub['child_run']}").json()
    assert child["parent"] == {"run": run["id"], "step": "sub"}
    assert child["params"] == {"version": "3"}


def test_a_refused_start_with_inline_steps_stores_no_version(api, people):
    from goals.models import Goal

    closed = Goal.objects.create(title="Done", status="completed")
    response = api["alice"].post("/api/runs", {"spec": "adhoc", "goal": closed.pk,
                                               "steps": [{"key": "a"}]})
    assert response.status_code == 409 and "closed goal" in response.json()["error"]
    assert not WorkflowSpec.objects.filter(name="adhoc").exists()


@pytest.mark.parametrize("field, value, way", [
    ("status", "completed", "a run's status follows from its steps"),
    ("run_status", "completed", "POST /api/runs/{id}/cancel ends a run"),
    ("owner", "bob", "who reports is the API token's user"),
    ("actor", "agent-7", "give each agent its own token"),
    ("step_title", "Renamed", "add a step with its title through POST /api/runs/{id}/steps"),
    ("max_retries", 3, "retries are the spec's"),
    ("retry_policy", "exponential", "the retry policy is the spec's"),
    ("retry_after", "2026-12-06T00:00:00Z", "POST /api/runs/{id}/steps/{key}/retry"),
    ("requires_approval", False, "a report never passes or skips one"),
    ("compensation", {"shell": "undo"}, "a compensation is declared on the step"),
])
def test_other_runtimes_transition_fields_are_refused_with_tollgates_way(api, task, field,
                                                                          value, way):
    before = Checkpoint.objects.filter(run_id=task["id"]).count()
    response = api["alice"].post(f"/api/runs/{task['id']}/transition",
                                 {"step": "work", "step_status": "completed", field: value})
    assert response.status_code == 400
    assert f"{field} is not taken: " in response.json()["error"] and way in (
        response.json()["error"])
    assert Checkpoint.objects.filter(run_id=task["id"]).count() == before


def test_what_the_retry_after_refusal_advises_works(api, task):
    """The advice: fail the step, an operator retries it, the agent reports it running."""
    run = task["id"]
    failed = api["alice"].post(f"/api/runs/{run}/transition",
                               {"step": "work", "step_status": "failed", "summary": "flaky"})
    assert failed.status_code == 200, failed.json()
    retried = api["alice"].post(f"/api/runs/{run}/steps/work/retry", {})
    assert retried.status_code == 200, retried.json()
    again = api["alice"].post(f"/api/runs/{run}/transition",
                              {"step": "work", "step_status": "running"})
    assert again.status_code == 200, again.json()
    assert again.json()["run"]["status"] == "running"


def test_a_step_given_as_a_title_is_a_wait_step(api, task):
    started = api["alice"].post("/api/runs", {"spec": "checklist", "steps": [
        "Review the diff", {"key": "ship", "depends_on": ["review-the-diff"]}]})
    assert started.status_code == 201, started.json()
    steps = {s["key"]: s for s in started.json()["steps"]}
    assert steps["review-the-diff"]["title"] == "Review the diff"
    assert steps["review-the-diff"]["kind"] == "wait"
    added = api["alice"].post(f"/api/runs/{task['id']}/steps",
                              {"steps": ["Tell the customer"]})
    assert added.status_code == 201, added.json()
    assert "tell-the-customer" in {s["key"] for s in added.json()["steps"]}
    refused = api["alice"].post("/api/runs", {"spec": "checklist2", "steps": ["  "]})
    assert refused.status_code == 400
    assert "step 1: a step given as text needs a title" in refused.json()["error"]

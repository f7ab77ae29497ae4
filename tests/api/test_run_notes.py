"""A run-level checkpoint (a note on the run, naming no step and moving no status), the shared
state as it stood after any checkpoint, and what a run and its steps say of their latest
report, label and duration: through the API and the command alike."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.management import CommandError, call_command

from workflows import engine
from workflows.models import Checkpoint, Run
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

AGENT = {"name": "agent-loop", "steps": [
    {"key": "plan", "title": "Plan"},
    {"key": "review", "title": "Review", "depends_on": ["plan"],
     "approval": {"group": "qa", "form": [{"name": "ok", "type": "boolean"}]}}]}


@pytest.fixture
def run(people):
    store_spec(AGENT)
    return engine.open_run("agent-loop", actor=people["alice"],
                           shared_state={"round": 0}).run


def test_a_transition_without_a_step_notes_the_run_and_moves_nothing(api, run):
    before = {s.key: s.status for s in run.steps.all()}
    answer = api["alice"].post(f"/api/runs/{run.pk}/transition", {
        "summary": "Picked the plan with the smaller diff", "label": "chose-plan",
        "evidence": {"candidates": 3}, "state_patch": {"round": 1},
        "next_action": "write the plan"})
    assert answer.status_code == 200, answer.json()
    checkpoint = answer.json()["checkpoint"]
    assert (checkpoint["kind"], checkpoint["step"], checkpoint["label"]) == (
        "run_note", None, "chose-plan")
    # The checkpoint keeps the next action said with it.
    assert checkpoint["evidence"] == {"candidates": 3, "next_action": "write the plan"}
    assert checkpoint["step_status"] == "" and checkpoint["run_status"] == run.status
    fresh = answer.json()["run"]
    assert fresh["status"] == run.status and fresh["last_label"] == "chose-plan"
    assert fresh["shared_state"] == {"round": 1} and fresh["next_action"] == "write the plan"
    assert {s["key"]: s["status"] for s in fresh["steps"]} == before


@pytest.mark.parametrize("body, says", [
    ({"step_status": "completed", "summary": "x"}, "name the step"),
    ({"blocker_reason": "waiting", "summary": "x"}, "name the step"),
    ({}, "needs a summary"),
    ({"summary": "x", "shared_state_mode": "replace"}, "needs state_patch"),
])
def test_a_note_that_says_nothing_or_speaks_for_a_step_is_refused(api, run, body, says):
    answer = api["alice"].post(f"/api/runs/{run.pk}/transition", body)
    assert answer.status_code == 400 and says in answer.json()["error"]
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_only_the_requester_or_an_operator_notes_an_open_run(api, run):
    assert api["erin"].post(f"/api/runs/{run.pk}/transition",
                            {"summary": "x"}).status_code in (403, 404)
    engine.cancel_run(run, actor=api["alice"].user, reason="done with it")
    answer = api["alice"].post(f"/api/runs/{run.pk}/transition", {"summary": "late"})
    assert answer.status_code == 409 and "cancelled" in answer.json()["error"]


def test_the_state_as_it_stood_after_each_checkpoint(api, run, people):
    alice = api["alice"]
    alice.post(f"/api/runs/{run.pk}/transition", {"step": "plan", "step_status": "running",
                                                  "state_patch": {"plan": "a"}})
    alice.post(f"/api/runs/{run.pk}/transition", {
        "state_patch": {"fresh": True}, "shared_state_mode": "replace", "summary": "reset"})
    alice.post(f"/api/runs/{run.pk}/transition", {"step": "plan", "step_status": "completed",
                                                  "state_patch": {"plan": "b"}})
    engine.approve(run, "review", user=people["bob"], values={"ok": True})
    run.refresh_from_db()
    states = [alice.get(f"/api/runs/{run.pk}/state", at=seq).json()
              for seq in range(1, run.checkpoint_seq + 1)]
    assert states[0] == {"round": 0}
    assert states[1] == {"round": 0, "plan": "a"}
    assert states[2] == {"fresh": True}  # replaced, not merged
    assert states[3] == {"fresh": True, "plan": "b"}
    assert states[-1] == run.shared_state == {"fresh": True, "plan": "b",
                                              "review": {"ok": True}}
    assert alice.get(f"/api/runs/{run.pk}/state").json() == run.shared_state
    beyond = alice.get(f"/api/runs/{run.pk}/state", at=run.checkpoint_seq + 1)
    assert beyond.status_code == 404 and f"1 to {run.checkpoint_seq}" in beyond.json()["error"]
    assert alice.get(f"/api/runs/{run.pk}/state", at=0).status_code == 400

    # The audit export carries every checkpoint field and the state after each.
    audit = alice.get(f"/api/runs/{run.pk}/audit").json()
    assert [row["state"] for row in audit["timeline"]] == states
    # Unlabelled, a note is labelled with the run's status, a report with the step's.
    assert audit["timeline"][2]["label"] == audit["timeline"][2]["run_status"]
    assert audit["timeline"][2]["summary"] == "reset"
    assert audit["timeline"][3]["label"] == "completed"
    assert audit["timeline"][3]["evidence"]["attempt"] == 1
    rows = list(csv.DictReader(io.StringIO(b"".join(
        alice.client.get(f"/api/runs/{run.pk}/audit.csv").streaming_content).decode())))
    timeline = [row for row in rows if row["record"] == "timeline"]
    assert [json.loads(row["state"]) for row in timeline] == states
    assert {"label", "evidence", "state_patch", "hash", "prev_hash"} <= set(rows[0])


def test_a_step_and_a_run_say_their_latest_report_label_and_duration(api, run):
    alice = api["alice"]
    alice.post(f"/api/runs/{run.pk}/transition", {"step": "plan", "step_status": "running",
                                                  "label": "started"})
    alice.post(f"/api/runs/{run.pk}/transition", {
        "step": "plan", "step_status": "completed", "evidence": {"files": 2},
        "state_patch": {"plan": "b"}})
    fresh = alice.get(f"/api/runs/{run.pk}").json()
    plan = next(s for s in fresh["steps"] if s["key"] == "plan")
    assert plan["last_evidence"] == {"files": 2} and plan["last_state_patch"] == {"plan": "b"}
    assert plan["duration_seconds"] >= 0
    review = next(s for s in fresh["steps"] if s["key"] == "review")
    assert review["duration_seconds"] is not None  # waiting since it opened
    # The latest report had no label of its own: it says the step's status.
    assert fresh["last_label"] == "completed" and fresh["duration_seconds"] >= 0


def test_the_command_notes_a_run_or_reports_a_step(run, people):
    out = io.StringIO()
    call_command("transition", str(run.pk), "--summary", "halfway", "--label", "mid",
                 "--state", '{"round": 2}', "--as", "alice", stdout=out)
    assert "checkpoint 2: halfway" in out.getvalue()
    run.refresh_from_db()
    assert (run.last_label, run.shared_state) == ("mid", {"round": 2})
    note = Checkpoint.objects.get(run=run, seq=2)
    assert (note.kind, note.step_id, note.actor_name) == ("run_note", None, "alice")
    call_command("transition", str(run.pk), "--step", "plan", "--status", "running",
                 stdout=io.StringIO())
    assert run.steps.get(key="plan").status == "running"
    for args, says in ((["--status", "completed"], "give --step"),
                       (["--summary", "x", "--evidence", "[1]"], "JSON object"),
                       (["--summary", "x", "--state", "{nope"], "not JSON")):
        with pytest.raises(CommandError, match=says):
            call_command("transition", str(run.pk), *args, stdout=io.StringIO())
    assert Run.objects.get(pk=run.pk).checkpoint_seq == 3

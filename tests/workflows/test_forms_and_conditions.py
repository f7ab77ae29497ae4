"""Gate forms (what approvers fill in) and `when` (steps that run only if a condition holds):
the branch an approver chooses, without code."""

from __future__ import annotations

import html
import json

import pytest
from django.test import Client

from workflows import engine
from workflows.models import Approval, Checkpoint, Step
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec

from .helpers import kinds, status

pytestmark = pytest.mark.django_db

ROLLOUT = {
    "name": "rollout",
    "params": [{"name": "region", "type": "choice", "options": ["eu", "us"], "default": "eu"}],
    "steps": [
        {"key": "build", "run": {"callable": "workflows.callables.noop"}},
        {"key": "qa", "title": "QA sign-off", "depends_on": ["build"], "approval": {
            "group": "qa", "required": 1,
            "form": [
                {"name": "rollout", "type": "choice", "options": ["canary", "full"],
                 "required": True, "label": "How to roll out"},
                {"name": "percent", "type": "number", "default": 10},
                {"name": "notes", "type": "text"},
                {"name": "urgent", "type": "boolean"},
            ]}},
        {"key": "canary", "depends_on": ["qa"], "when": {"state": "qa.rollout",
                                                         "equals": "canary"},
         "run": {"callable": "workflows.callables.noop"}},
        {"key": "full", "depends_on": ["qa"], "when": {"state": "qa.rollout", "equals": "full"},
         "run": {"callable": "workflows.callables.noop"}},
        {"key": "us-only", "depends_on": ["full"], "when": {"params": "region", "equals": "us"},
         "run": {"callable": "workflows.callables.noop"}},
        {"key": "announce", "depends_on": ["canary", "full", "us-only"],
         "run": {"callable": "workflows.callables.noop"}},
    ],
}


@pytest.fixture
def gate(people):
    store_spec(ROLLOUT)
    run = engine.open_run("rollout", actor=people["alice"], title="Rollout 2.0").run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    return run


class TestSpec:
    @pytest.mark.parametrize("when, problem", [
        ({"state": "qa.rollout"}, "needs exactly one of equals, not_equals, in, exists"),
        ({"state": "a", "params": "b", "equals": 1}, "needs exactly one of state or params"),
        ({"state": "a b", "equals": 1}, "must be a dotted key"),
        ({"state": "a", "in": []}, "in must be a non-empty list"),
        ({"state": "a", "exists": "yes"}, "exists must be true or false"),
        ({"state": "a", "equals": {"x": 1}}, "equals must be a string, number"),
        ("rollout == canary", "must be an object"),
    ])
    def test_a_bad_condition_is_refused_naming_the_step(self, when, problem):
        with pytest.raises(SpecError, match=f"step 'b' when: .*{problem}"):
            validate_spec({"name": "s", "steps": [
                {"key": "a", "run": {"command": ["true"]}},
                {"key": "b", "depends_on": ["a"], "when": when, "run": {"command": ["true"]}}]})

    @pytest.mark.parametrize("form, problem", [
        ([{"name": "rollout", "type": "choice"}], "field 'rollout': a choice needs options"),
        ([{"name": "n", "type": "number", "default": "ten"}], "field 'n': default must be a"),
        ([{"name": "n"}, {"name": "n"}], "field 'n': declared twice"),
        ([], "form has no fields"),
        ([{"name": "x", "colour": "red"}], "field 'x': unknown field 'colour'"),
    ])
    def test_a_bad_form_is_refused_naming_the_step(self, form, problem):
        with pytest.raises(SpecError, match=f"step 'qa' approval.*{problem}"):
            validate_spec({"name": "s", "steps": [
                {"key": "qa", "approval": {"group": "qa", "form": form}}]})


class TestForms:
    def test_the_values_are_kept_with_the_approval_and_in_the_shared_state(self, gate,
                                                                          people):
        checkpoint = engine.approve(gate, "qa", user=people["bob"], comment="ship it",
                                    values={"rollout": "canary", "notes": "watch errors"})
        approval = Approval.objects.get(step__run=gate, step__key="qa")
        expected = {"rollout": "canary", "percent": 10, "notes": "watch errors"}
        assert approval.values == expected
        gate.refresh_from_db()
        assert gate.shared_state["qa"] == expected
        assert checkpoint.evidence["values"] == expected
        assert checkpoint.state_patch == {"qa": expected}

    @pytest.mark.parametrize("values, field, problem", [
        ({}, "rollout", "is required"),
        ({"rollout": "sideways"}, "rollout", "must be one of canary, full"),
        ({"rollout": "full", "percent": "lots"}, "percent", "must be a number"),
        ({"rollout": "full", "colour": "red"}, "colour", "not declared"),
    ])
    def test_a_bad_value_records_nothing_and_names_the_field(self, gate, people, values,
                                                            field, problem):
        before = Checkpoint.objects.filter(run=gate).count()
        with pytest.raises(engine.InvalidInput,
                           match=rf"{problem}.*\(field '{field}'\)") as err:
            engine.approve(gate, "qa", user=people["bob"], values=values)
        assert field in err.value.errors
        assert not Approval.objects.filter(step__run=gate).exists()
        assert Checkpoint.objects.filter(run=gate).count() == before
        assert status(gate)["qa"] == "waiting_approval"

    def test_a_later_approver_replaces_a_field_an_earlier_one_gave(self, people):
        spec = {**ROLLOUT, "name": "two-approvers", "steps": [
            {**ROLLOUT["steps"][1], "depends_on": [],
             "approval": {**ROLLOUT["steps"][1]["approval"], "required": 2}}]}
        store_spec(spec)
        run = engine.open_run("two-approvers", actor=people["alice"]).run
        engine.approve(run, "qa", user=people["bob"], values={"rollout": "canary",
                                                              "notes": "bob"})
        engine.approve(run, "qa", user=people["carol"], values={"rollout": "full"})
        run.refresh_from_db()
        assert run.shared_state["qa"] == {"rollout": "full", "percent": 10, "notes": "bob"}

    def test_the_api_takes_the_values_and_names_a_refused_field(self, gate, people):
        client = Client()
        client.force_login(people["bob"])
        url = f"/api/runs/{gate.pk}/steps/qa/approve"
        refused = client.post(url, {"values": {"rollout": "sideways"}},
                              content_type="application/json")
        assert refused.status_code == 400
        assert refused.json()["fields"] == {"rollout": "must be one of canary, full, got "
                                                       "'sideways'"}
        done = client.post(url, {"comment": "ok", "values": {"rollout": "full"}},
                           content_type="application/json")
        assert done.status_code == 200 and done.json()["shared_state"]["qa"]["rollout"] == "full"

    def test_the_inbox_shows_the_form_and_a_refusal_beside_its_field(self, gate, people):
        client = Client()
        client.force_login(people["bob"])
        inbox = client.get("/").content.decode()
        assert 'name="field_rollout"' in inbox and "How to roll out" in inbox
        url = f"/runs/{gate.pk}/steps/qa/approve/"
        refused = client.post(url, {"view": "inbox", "field_rollout": "sideways",
                                    "field_percent": "5"}, HTTP_HX_REQUEST="true")
        assert refused.status_code == 400
        card = refused.content.decode()
        assert "must be one of canary, full" in card
        assert "Nothing was recorded: check the fields below." in card
        assert "(field 'rollout')" not in html.unescape(card)  # said beside the field
        assert 'value="5"' in card  # what was typed is kept
        assert not Approval.objects.filter(step__run=gate).exists()
        done = client.post(url, {"view": "inbox", "field_rollout": "canary",
                                 "field_urgent": "on"}, HTTP_HX_REQUEST="true")
        assert done.status_code == 200
        gate.refresh_from_db()
        assert gate.shared_state["qa"] == {"rollout": "canary", "percent": 10,
                                           "urgent": True}

    def test_an_unticked_box_is_false_from_the_run_page(self, gate, people):
        client = Client()
        client.force_login(people["bob"])
        page = client.get(f"/runs/{gate.pk}/").content.decode()
        assert 'name="field_urgent"' in page
        response = client.post(f"/runs/{gate.pk}/steps/qa/approve/",
                               {"field_rollout": "full"})
        assert response.status_code == 302
        gate.refresh_from_db()
        assert gate.shared_state["qa"]["urgent"] is False

    def test_my_decisions_and_the_audit_show_the_values(self, gate, people):
        engine.approve(gate, "qa", user=people["bob"], values={"rollout": "full"})
        client = Client()
        client.force_login(people["bob"])
        page = client.get("/decisions/").content.decode()
        assert "<dt>rollout</dt><dd><bdi>full</bdi></dd>" in page
        audit = client.get(f"/runs/{gate.pk}/audit/").content
        assert json.loads(audit)["decisions"][0]["values"]["rollout"] == "full"


class TestConditions:
    def test_the_branch_the_approver_chose_runs_and_the_other_is_skipped(self, gate, people):
        engine.approve(gate, "qa", user=people["bob"], values={"rollout": "canary"})
        now = status(gate)
        assert now["canary"] == "pending" and now["full"] == "skipped"
        # Skipping `full` settles it, so `us-only` is tested in turn (region is eu): skipped.
        assert now["us-only"] == "skipped"
        skipped = Checkpoint.objects.filter(run=gate, kind="step_skipped").order_by("seq")
        assert [c.step.key for c in skipped] == ["full", "us-only"]
        assert all(c.actor_name == "condition" for c in skipped)
        assert "qa.rollout is 'canary', the condition wants 'full'" in skipped[0].summary
        assert "params region is 'eu', the condition wants 'us'" in skipped[1].summary
        assert kinds(gate)[-3:] == ["step_approved", "step_skipped", "step_skipped"]
        for key in ("canary", "announce"):
            engine.start_step(gate, key)
            engine.complete_step(gate, key)
        assert status(gate)["run"] == "completed"

    def test_a_condition_on_params(self, people):
        store_spec(ROLLOUT)
        run = engine.open_run("rollout", actor=people["alice"], params={"region": "us"}).run
        engine.start_step(run, "build")
        engine.complete_step(run, "build")
        engine.approve(run, "qa", user=people["bob"], values={"rollout": "full"})
        assert status(run)["canary"] == "skipped" and status(run)["full"] == "pending"
        engine.start_step(run, "full")
        engine.complete_step(run, "full")
        assert status(run)["us-only"] == "pending"

    def test_a_condition_is_tested_once_its_dependencies_settle(self, people):
        store_spec({"name": "late", "steps": [
            {"key": "a", "run": {"callable": "workflows.callables.noop"}},
            {"key": "b", "depends_on": ["a"], "when": {"state": "go", "exists": True},
             "run": {"callable": "workflows.callables.noop"}}]})
        run = engine.open_run("late").run
        assert status(run)["b"] == "pending"  # not tested: `a` has not settled
        engine.start_step(run, "a")
        engine.complete_step(run, "a", state_patch={"go": 1})
        assert status(run)["b"] == "pending"
        assert Step.objects.get(run=run, key="b").rung_at is not None  # ready for a worker


OVERWRITE = {
    "name": "overwrite",
    "steps": [
        {"key": "qa", "approval": {"group": "qa", "form": [
            {"name": "rollout", "type": "choice", "options": ["canary", "full"],
             "required": True}]}},
        {"key": "notes", "depends_on": ["qa"]},  # a wait step its requester reports
        {"key": "agent", "depends_on": ["qa"], "run": {"callable": "workflows.callables.noop"}},
        {"key": "full", "depends_on": ["notes", "agent"],
         "when": {"state": "qa.rollout", "equals": "full"},
         "run": {"callable": "workflows.callables.noop"}},
    ],
}


class TestDecidedValuesStand:
    """What an approver chose cannot be rewritten by a later patch: not by the requester
    reporting a wait step, not by a worker's (or an agent's) state patch."""

    @pytest.fixture
    def decided(self, people):
        store_spec(OVERWRITE)
        run = engine.open_run("overwrite", actor=people["bob"]).run
        engine.approve(run, "qa", user=people["carol"], values={"rollout": "canary"})
        return run

    def test_a_transition_may_not_rewrite_the_gates_key(self, decided, people):
        from workflows.models import ApiToken

        token = ApiToken.objects.issue(people["bob"])[1]
        response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
            f"/api/runs/{decided.pk}/transition",
            {"step": "notes", "step_status": "completed",
             "state_patch": {"qa": {"rollout": "full"}}}, content_type="application/json")
        assert response.status_code == 400
        assert "'qa'" in response.json()["error"] and "approvers" in response.json()["error"]
        with pytest.raises(engine.InvalidInput, match="gate 'qa'"):
            engine.record_transition(decided, "notes", actor=people["bob"],
                                     step_status="completed", state_patch={"qa": {}},
                                     shared_state_mode="replace")
        assert status(decided)["notes"] == "pending"  # refused whole: nothing changed
        decided.refresh_from_db()
        assert decided.shared_state == {"qa": {"rollout": "canary"}}

    def test_a_workers_patch_to_it_fails_its_step_and_when_reads_the_choice(self, decided,
                                                                             people):
        engine.record_transition(decided, "notes", actor=people["bob"], step_status="completed",
                                 state_patch={"notes": "fine"})
        engine.start_step(decided, "agent")
        with pytest.raises(engine.InvalidInput, match="gate 'qa'"):
            engine.complete_step(decided, "agent", state_patch={"qa": {"rollout": "full"}})
        # From a worker, the refused result fails the attempt, saying why.
        from workflows.workers import worker
        from workflows.workers.executors import Outcome

        step = decided.steps.get(key="agent")
        checkpoint = worker._record_step(step, step.lease_token, "worker w", Outcome(
            True, "done", {}, {"qa": {"rollout": "full"}}))
        assert checkpoint.kind == "step_failed" and "gate 'qa'" in checkpoint.summary
        decided.refresh_from_db()
        assert decided.shared_state["qa"] == {"rollout": "canary"}
        engine.retry_step(decided, "agent", actor=people["alice"])
        engine.start_step(decided, "agent")
        engine.complete_step(decided, "agent", state_patch={"agent": "done"})
        assert status(decided)["full"] == "skipped" and status(decided)["run"] == "completed"

    def test_a_value_written_there_before_the_decision_is_not_the_approvers(self, people):
        store_spec({**OVERWRITE, "name": "early", "steps": [
            {"key": "prep"}, {**OVERWRITE["steps"][0], "depends_on": ["prep"]}]})
        run = engine.open_run("early", actor=people["bob"]).run
        engine.record_transition(run, "prep", actor=people["bob"], step_status="completed",
                                 state_patch={"qa": {"rollout": "full", "approved_by": "me"}})
        engine.approve(run, "qa", user=people["carol"], values={"rollout": "canary"})
        run.refresh_from_db()
        assert run.shared_state["qa"] == {"rollout": "canary"}

    def test_an_approval_that_leaves_the_form_empty_still_takes_its_key(self, people):
        """An optional field left empty: the requester's value (before or after) must not
        stand in for the approver's choice."""
        store_spec({"name": "optional", "steps": [
            {"key": "prep"},
            {"key": "qa", "depends_on": ["prep"], "approval": {"group": "qa", "form": [
                {"name": "rollout", "type": "choice", "options": ["canary", "full"]}]}},
            {"key": "notes", "depends_on": ["qa"]},
            {"key": "full", "depends_on": ["notes"],
             "when": {"state": "qa.rollout", "equals": "full"},
             "run": {"callable": "workflows.callables.noop"}}]})
        run = engine.open_run("optional", actor=people["bob"]).run
        engine.record_transition(run, "prep", actor=people["bob"], step_status="completed",
                                 state_patch={"qa": {"rollout": "full"}})
        engine.approve(run, "qa", user=people["carol"], values={})
        run.refresh_from_db()
        assert run.shared_state["qa"] == {}
        with pytest.raises(engine.InvalidInput, match="gate 'qa'"):
            engine.record_transition(run, "notes", actor=people["bob"],
                                     step_status="completed",
                                     state_patch={"qa": {"rollout": "full"}})
        engine.record_transition(run, "notes", actor=people["bob"], step_status="completed")
        assert status(run)["full"] == "skipped"

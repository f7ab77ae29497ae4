"""Approval policy as data: rules per run over params and state, stages in order, the
reject policy and the requester's manager; every entry point asks the one engine rule."""

from __future__ import annotations

import pytest

from workflows import engine
from workflows.delivery.notifications import messages_for
from workflows.delivery.outbox import notification_events
from workflows.engine import Announcement
from workflows.errors import InvalidInput
from workflows.models import Approval, Checkpoint, GateRule, Preference
from workflows.people import permissions
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec

from ..conftest import make_user
from .helpers import work

pytestmark = pytest.mark.django_db

PAYMENT = {"name": "payment", "params": [{"name": "amount", "type": "number"}], "steps": [
    {"key": "pay", "title": "Pay the invoice", "approval": {"rules": [
        {"group": "leads", "label": "team lead"},
        {"group": "finance", "when": {"params": "amount", "gt": 10000},
         "label": "finance over 10k"},
    ]}},
]}

DEPLOY = {"name": "deploy", "steps": [
    {"key": "target", "title": "Choose target", "run": {"command": ["true"]}},
    {"key": "go", "title": "Deploy", "depends_on": ["target"], "approval": {"rules": [
        {"group": "release", "required": 2, "label": "two release managers",
         "when": {"state": "env", "equals": "production"}},
        {"group": "release", "label": "one release manager",
         "when": {"state": "env", "not_equals": "production"}},
        {"group": "oncall", "label": "on call"},
    ]}},
]}

STAGED = {"name": "staged", "steps": [
    {"key": "buy", "approval": {"rules": [
        {"group": "leads", "label": "team lead", "order": 0},
        {"group": "finance", "label": "finance", "order": 1},
    ]}},
]}


@pytest.fixture
def team(db):
    return {
        "rita": make_user("rita", "leads", perms=("add_run", "operate_run")),
        "lee": make_user("lee", "leads"),
        "fin": make_user("fin", "finance"),
        "fay": make_user("fay", "finance"),
        "both": make_user("both", "leads", "finance"),
        "rel1": make_user("rel1", "release"),
        "rel2": make_user("rel2", "release"),
        "onc": make_user("onc", "oncall"),
        "boss": make_user("boss"),
        "out": make_user("out"),
    }


def rules_of(run, key):
    return list(GateRule.objects.filter(step__run=run, step__key=key).order_by("position"))


def status(run, key):
    return run.steps.get(key=key).status


class TestValidation:
    """Rules are checked when the spec is loaded; each error names the step and the rule."""

    @pytest.mark.parametrize("approval, problem", [
        ({"rules": []}, "rules must be a non-empty list"),
        ({"rules": [{"group": "a", "when": {"params": "x", "gt": 1}}]},
         "every rule has a when"),
        ({"rules": [{"group": "a"}], "group": "b"}, "group, required and allow_self_approval "
                                                    "belong in each rule"),
        ({"rules": [{"group": "a"}, {"required": 2}]}, "rule 2: group is required"),
        ({"rules": [{"group": "a", "colour": "red"}]}, "rule 1: unknown field 'colour'"),
        ({"rules": [{"group": "a"}, {"group": "a"}]}, "two rules have the same label"),
        ({"rules": [{"manager": True}]}, "a manager rule needs a group too"),
        ({"rules": [{"manager": True, "group": "a", "required": 2}]},
         "a manager rule is met by one person"),
        ({"rules": [{"group": "a"}, {"group": "b", "when": {"params": "x", "gt": "10"}}]},
         "rule 2 when: gt compares numbers"),
        ({"rules": [{"group": "a", "order": -1}]}, "order must not be negative"),
        ({"group": "a", "reject": "majority"}, "reject must be 'any'"),
    ])
    def test_a_bad_rule_is_refused_by_name(self, approval, problem):
        with pytest.raises(SpecError) as refused:
            validate_spec({"name": "s", "steps": [{"key": "gate", "approval": approval}]})
        assert "step 'gate' approval" in str(refused.value)
        assert problem in str(refused.value)

    def test_numeric_tests_work_in_a_steps_own_when_too(self):
        spec = validate_spec({"name": "s", "steps": [
            {"key": "big", "when": {"params": "n", "gte": 5}}]})
        assert spec["steps"][0]["when"] == {"params": "n", "gte": 5}


class TestRulesMatchTheRun:
    def test_a_large_payment_needs_finance_as_well(self, team):
        spec = store_spec(PAYMENT)[0]
        run = engine.open_run(spec, actor=team["rita"], params={"amount": 25000}).run
        assert [r.label for r in rules_of(run, "pay")] == ["team lead", "finance over 10k"]
        engine.approve(run, "pay", user=team["lee"])
        assert status(run, "pay") == "waiting_approval"
        engine.approve(run, "pay", user=team["fin"])
        assert status(run, "pay") == "completed"
        approved = Checkpoint.objects.get(run=run, kind="step_approved")
        assert approved.evidence["rule"] == "finance over 10k"
        assert [r["met"] for r in approved.evidence["rules"]] == [True, True]

    def test_a_small_payment_needs_the_lead_alone(self, team):
        spec = store_spec(PAYMENT)[0]
        run = engine.open_run(spec, actor=team["rita"], params={"amount": 500}).run
        assert [r.label for r in rules_of(run, "pay")] == ["team lead"]
        gate = run.steps.get(key="pay")
        # Finance is not asked, and cannot decide it.
        assert "not in the 'leads' group" in permissions.decide_refusal(team["fin"], run, gate)
        engine.approve(run, "pay", user=team["lee"])
        assert status(run, "pay") == "completed"

    def test_rules_over_state_read_it_when_the_gate_opens(self, team):
        spec = store_spec(DEPLOY)[0]
        prod = engine.open_run(spec, actor=team["rita"]).run
        work(prod, "target", state_patch={"env": "production"})
        staging = engine.open_run(spec, actor=team["rita"]).run
        work(staging, "target", state_patch={"env": "staging"})
        assert [(r.label, r.required) for r in rules_of(prod, "go")] == [
            ("two release managers", 2), ("on call", 1)]
        assert [(r.label, r.required) for r in rules_of(staging, "go")] == [
            ("one release manager", 1), ("on call", 1)]
        engine.approve(staging, "go", user=team["rel1"])
        engine.approve(staging, "go", user=team["onc"])
        assert status(staging, "go") == "completed"
        engine.approve(prod, "go", user=team["rel1"])
        engine.approve(prod, "go", user=team["onc"])
        assert status(prod, "go") == "waiting_approval"  # one release manager short
        engine.approve(prod, "go", user=team["rel2"])
        assert status(prod, "go") == "completed"

    def test_rules_fail_closed_on_a_missing_or_mistyped_value(self, team):
        spec = store_spec(DEPLOY)[0]
        missing = engine.open_run(spec, actor=team["rita"]).run
        work(missing, "target", state_patch={})
        mistyped = engine.open_run(spec, actor=team["rita"]).run
        work(mistyped, "target", state_patch={"env": ["production"]})
        for run in (missing, mistyped):
            labels = [r.label for r in rules_of(run, "go")]
            assert "two release managers" in labels, labels
        risky = store_spec({"name": "risky", "params": [
            {"name": "risk", "type": "string", "required": False}], "steps": [
            {"key": "ok", "approval": {"rules": [
                {"group": "leads"},
                {"group": "finance", "when": {"params": "risk", "gt": 50}}]}}]})[0]
        for params in ({}, {"risk": "90"}):
            run = engine.open_run(risky, actor=team["rita"], params=params).run
            assert [r.group for r in rules_of(run, "ok")] == ["leads", "finance"], params

    def test_what_the_rules_read_cannot_be_rewritten(self, team):
        """staging passed with one lead; the requester then tried to make it production."""
        spec = store_spec({**DEPLOY, "name": "deploy2", "steps": [
            *DEPLOY["steps"],
            {"key": "report", "depends_on": ["go"]},
            {"key": "prod", "depends_on": ["report"], "run": {"command": ["true"]},
             "when": {"state": "env", "equals": "production"}}]})[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        work(run, "target", state_patch={"env": "staging"})
        engine.approve(run, "go", user=team["rel1"])
        engine.approve(run, "go", user=team["onc"])
        for mode, patch in (("merge", {"env": "production"}),
                            ("replace", {"env": "production"}), ("replace", {})):
            with pytest.raises(InvalidInput, match="'env'"):
                engine.record_transition(run, "report", step_status="completed",
                                         state_patch=patch, actor=team["rita"],
                                         shared_state_mode=mode)
        engine.record_transition(run, "report", step_status="completed", actor=team["rita"],
                                 state_patch={"notes": "fine"})
        assert status(run, "prod") == "skipped"

    def test_a_report_cannot_overwrite_what_a_worker_computed_for_the_rules(self, team):
        spec = store_spec({"name": "risk", "steps": [
            {"key": "score", "run": {"command": ["true"]}},
            {"key": "explain", "depends_on": ["score"]},
            {"key": "ok", "depends_on": ["explain"], "approval": {"rules": [
                {"group": "leads"},
                {"group": "finance", "when": {"state": "risk", "gt": 50}}]}}]})[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        work(run, "score", state_patch={"risk": 90})
        with pytest.raises(InvalidInput, match="'risk'"):
            engine.record_transition(run, "explain", step_status="completed",
                                     state_patch={"risk": 1}, actor=team["rita"])
        engine.record_transition(run, "explain", step_status="completed", actor=team["rita"],
                                 state_patch={"risk": 90, "why": "big change"})  # unchanged
        assert [r.group for r in rules_of(run, "ok")] == ["leads", "finance"]

    def test_one_person_counts_toward_one_rule_only(self, team):
        spec = store_spec(PAYMENT)[0]
        run = engine.open_run(spec, actor=team["rita"], params={"amount": 25000}).run
        engine.approve(run, "pay", user=team["both"])  # in leads and finance: fills one
        assert [r.approvals for r in rules_of(run, "pay")] == [1, 0]
        with pytest.raises(engine.IllegalTransition, match="already decided"):
            engine.approve(run, "pay", user=team["both"])
        assert status(run, "pay") == "waiting_approval"
        engine.approve(run, "pay", user=team["fay"])
        assert status(run, "pay") == "completed"

    def test_the_run_page_and_the_card_say_which_rules_apply(self, team, client):
        spec = store_spec(PAYMENT)[0]
        run = engine.open_run(spec, actor=team["rita"], params={"amount": 500}).run
        client.force_login(team["lee"])
        page = client.get(f"/runs/{run.pk}/").content.decode()
        assert "<b>team lead</b>: 0 of 1 from <bdi>leads</bdi> · waiting" in page
        assert ("<b>finance over 10k</b>: does not apply (params amount is 500, the "
                "condition wants a number above 10000)") in page
        inbox = client.get("/").content.decode()
        assert "<b>team lead</b>: 0 of 1 from <bdi>leads</bdi>" in inbox


class TestStages:
    def test_a_later_stage_opens_once_the_earlier_is_met(self, team):
        spec = store_spec(STAGED)[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        gate = run.steps.get(key="buy")
        assert [r.open for r in rules_of(run, "buy")] == [True, False]
        assert not permissions.decidable_by(team["fin"]).filter(pk=gate.pk).exists()
        assert "not in the 'leads' group" in permissions.decide_refusal(team["fin"], run, gate)
        assert set(permissions.deciders(run, gate).values_list("username", flat=True)) == {
            "lee", "both"}  # rita requested it
        checkpoint = engine.approve(run, "buy", user=team["lee"])
        assert checkpoint.evidence["stage_opened"] == ["finance"]
        # The finance approvers are told now: the approval's checkpoint owes them mail.
        announcement = Announcement(run_id=run.pk, run_status=run.status,
                                    previous_status=run.status, checkpoint=checkpoint)
        assert ("gate_waiting", "buy") in notification_events(announcement)
        gate.refresh_from_db()
        assert set(permissions.deciders(run, gate).values_list("username", flat=True)) == {
            "fin", "fay", "both"}
        assert gate.approval_group == "finance"
        checkpoint = Checkpoint.objects.select_related("run", "run__requested_by").get(
            pk=checkpoint.pk)
        mailed = {user.username: subject for user, subject, text, html, _ in messages_for(
            checkpoint, "gate_waiting", "buy")}
        assert sorted(mailed) == ["both", "fay", "fin"]
        assert "buy waits on finance" in mailed["fin"]
        text = next(t for u, _, t, _, _ in messages_for(checkpoint, "gate_waiting", "buy"))
        assert "team lead: 1 of 1 from leads (met)" in text
        assert "finance: 0 of 1 from finance (waiting)" in text
        engine.approve(run, "buy", user=team["fay"])
        assert status(run, "buy") == "completed"


class TestRejectPolicy:
    def test_one_reject_ends_it_by_default(self, team):
        spec = store_spec(STAGED)[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        engine.reject(run, "buy", user=team["lee"], comment="no budget")
        assert status(run, "buy") == "failed"
        assert not GateRule.objects.filter(step__run=run, open=True).exists()

    def test_under_quorum_a_rules_count_of_rejects_ends_it(self, team):
        spec = store_spec({"name": "majority", "steps": [{"key": "vote", "approval": {
            "group": "release", "required": 2, "reject": "quorum"}}]})[0]
        make_user("rel3", "release")
        run = engine.open_run(spec, actor=team["rita"]).run
        first = engine.reject(run, "vote", user=team["rel1"], comment="not ready")
        assert first.kind == "rejection_recorded" and status(run, "vote") == "waiting_approval"
        engine.approve(run, "vote", user=team["rel2"])
        assert status(run, "vote") == "waiting_approval"  # 1 of 2 each way
        from django.contrib.auth.models import User

        engine.reject(run, "vote", user=User.objects.get(username="rel3"), comment="agree")
        assert status(run, "vote") == "failed"


class TestManagerRule:
    SPEC = {"name": "expense", "steps": [{"key": "ok", "approval": {"rules": [
        {"manager": True, "group": "finance"}]}}]}

    def test_the_requesters_manager_decides(self, team):
        Preference.objects.create(user=team["rita"], manager=team["boss"])
        spec = store_spec(self.SPEC)[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        gate = run.steps.get(key="ok")
        [rule] = rules_of(run, "ok")
        assert (rule.label, rule.audience) == ("the requester's manager",
                                               "boss (rita's manager)")
        assert "it waits on boss (rita's manager)" in permissions.decide_refusal(
            team["fin"], run, gate)
        run.refresh_from_db()
        assert run.what_next == "ok: waiting for approval"  # no "( group)"
        assert list(permissions.decidable_by(team["boss"])) == [gate]
        engine.approve(run, "ok", user=team["boss"])
        assert status(run, "ok") == "completed"

    def test_without_a_manager_on_record_the_group_decides(self, team):
        spec = store_spec(self.SPEC)[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        assert rules_of(run, "ok")[0].audience == "finance"
        engine.approve(run, "ok", user=team["fin"])
        assert status(run, "ok") == "completed"

    def test_the_sign_on_claim_sets_the_manager(self, team, settings):
        from workflows.sso.accounts import sign_in_user

        settings.TOLLGATE_OIDC_MANAGER_CLAIM = "manager_email"
        claims = {"sub": "r-1", "email": "rita@example.com", "email_verified": True,
                  "manager_email": "BOSS@example.com"}
        # The manager is found by the e-mail the provider verified for them, not by an
        # account's e-mail (anyone's unverified claim or an admin's typo could set that).
        assert team["boss"].email == "boss@example.com"
        rita = sign_in_user(claims, "https://idp.example")
        assert Preference.objects.get(user=rita).manager is None
        sign_in_user({"sub": "b-1", "email": "boss@example.com", "email_verified": True},
                     "https://idp.example")
        rita = sign_in_user(claims, "https://idp.example")
        assert rita == team["rita"]
        assert Preference.objects.get(user=rita).manager == team["boss"]
        # The provider is the source of truth: a manager it no longer names is cleared.
        sign_in_user({**claims, "manager_email": ""}, "https://idp.example")
        assert Preference.objects.get(user=rita).manager is None

    def test_nobody_is_their_own_manager(self, team):
        from django.db import IntegrityError, transaction

        with pytest.raises(IntegrityError), transaction.atomic():
            Preference.objects.create(user=team["rita"], manager=team["rita"])


def test_a_retried_gate_matches_its_rules_again(team):
    spec = store_spec(PAYMENT)[0]
    run = engine.open_run(spec, actor=team["rita"], params={"amount": 25000}).run
    engine.approve(run, "pay", user=team["lee"])
    engine.reject(run, "pay", user=team["fin"], comment="wrong account")
    engine.retry_step(run, "pay", actor=team["rita"])
    gate = run.steps.get(key="pay")
    assert gate.attempt == 2
    assert [(r.attempt, r.approvals, r.open) for r in rules_of(run, "pay")
            if r.attempt == 2] == [(2, 0, True), (2, 0, True)]
    # lee's earlier approval was of the first attempt: he decides again.
    engine.approve(run, "pay", user=team["lee"])
    assert Approval.objects.filter(step=gate, attempt=2).count() == 1


def test_the_inbox_filters_a_gate_by_any_group_it_waits_on(team, client):
    spec = store_spec(PAYMENT)[0]
    run = engine.open_run(spec, actor=team["rita"], params={"amount": 25000}).run
    gate = run.steps.get(key="pay")
    client.force_login(team["both"])
    page = client.get("/").content.decode()
    assert "<option>finance</option>" in page and "<option>leads</option>" in page
    for group in ("leads", "finance"):
        assert f'id="gate-{gate.pk}"' in client.get("/", {"group": group}).content.decode()
    engine.approve(run, "pay", user=team["lee"])  # the lead's rule is met: finance waits
    assert f'id="gate-{gate.pk}"' not in client.get("/", {"group": "leads"}).content.decode()
    assert f'id="gate-{gate.pk}"' in client.get("/", {"group": "finance"}).content.decode()


def test_a_decided_stage_names_who_decided_it(team, client):
    """A gate of several stages says, rule by rule, who counted toward each."""
    from tests.conftest import make_user

    Preference.objects.create(user=team["rita"], manager=team["boss"])
    spec = store_spec({"name": "staged-names", "steps": [{"key": "ok", "approval": {
        "rules": [{"group": "finance", "label": "Finance", "order": 0},
                  {"manager": True, "group": "finance", "label": "Manager", "order": 1}]}}]})[0]
    run = engine.open_run(spec, actor=team["rita"]).run
    engine.approve(run, "ok", user=team["fin"])
    engine.approve(run, "ok", user=team["boss"])
    admin = make_user("root", is_superuser=True, is_staff=True)
    client.force_login(admin)
    text = client.get(f"/runs/{run.pk}/").content.decode()
    assert "from <bdi>finance</bdi> (<bdi>fin</bdi>) · met" in text
    assert "from <bdi>boss (rita&#x27;s manager)</bdi> (<bdi>boss</bdi>) · met" in text

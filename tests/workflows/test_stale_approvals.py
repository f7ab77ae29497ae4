"""Approvals bound to what was seen: when a waiting gate's evidence changes (a report patches
the run's shared state), the approvals already made stop counting, the timeline says whose
and why, the approvers are told again, and a decision posted from a page drawn before the
change is refused."""

from __future__ import annotations

import html

import pytest
from django.test import Client

from workflows import engine
from workflows.models import Approval, Checkpoint, OutboxMessage, Step
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated(people):
    """A gate needing two approvals, beside a step an agent reports on (not before it)."""
    spec = store_spec({"name": "notes", "steps": [
        {"key": "qa", "approval": {"group": "qa", "required": 2}},
        {"key": "notes", "title": "Release notes"}]})[0]
    return engine.open_run(spec, actor=people["alice"], shared_state={"artifact": "a.tgz"}).run


def state(gated):
    return gated.steps.get(key="qa")


def test_a_change_of_evidence_makes_earlier_approvals_stop_counting(gated, people, settings):
    settings.TOLLGATE_NOTIFY = True
    engine.approve(gated, "qa", user=people["bob"])
    before = state(gated)
    assert before.attempt == 1
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "b.tgz"})
    after = state(gated)
    assert (after.attempt, after.status) == (2, "waiting_approval")
    assert after.evidence_digest != before.evidence_digest
    assert after.deadline_at == before.deadline_at
    said = Checkpoint.objects.filter(run=gated).order_by("-seq").first()
    assert said.evidence["approvals_stale"] == {"qa": {"stale": ["bob"], "changed": ["artifact"]}}
    assert "approvals of qa by bob no longer count: artifact changed" in said.summary
    # The approvers are told again, as when the gate opened.
    assert "qa" in said.evidence["gates_opened"]
    told = OutboxMessage.objects.filter(run=gated, seq=said.seq)
    assert ["gate_waiting", "qa"] in [event for message in told for event in message.events]
    # The run page marks it as no longer counting.
    page = Client()
    page.force_login(people["alice"])
    row = page.get(f"/runs/{gated.pk}/").content.decode().split('id="step-qa"')[1]
    row = row.split("</tr>")[0]
    assert "attempt 1: no longer counts" in row
    engine.approve(gated, "qa", user=people["carol"])
    assert state(gated).status == "waiting_approval"  # bob's earlier approval does not count
    engine.approve(gated, "qa", user=people["bob"])  # bob decides again, on what is there now
    assert state(gated).status == "completed"
    assert Approval.objects.filter(user=people["bob"]).count() == 2


def test_a_change_before_anyone_decided_stales_nothing(gated, people):
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "b.tgz"})
    gate = state(gated)
    assert gate.attempt == 1
    assert "approvals_stale" not in Checkpoint.objects.filter(run=gated).order_by(
        "-seq").first().evidence
    engine.approve(gated, "qa", user=people["bob"])
    assert Approval.objects.get().evidence_digest == gate.evidence_digest


def test_a_state_patch_that_changes_nothing_stales_nothing(gated, people):
    engine.approve(gated, "qa", user=people["bob"])
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "a.tgz"})
    assert state(gated).attempt == 1


def test_a_decision_from_a_page_drawn_before_the_change_is_refused(gated, people):
    bob = Client()
    bob.force_login(people["bob"])
    seen = state(gated).evidence_digest
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "b.tgz"})
    answer = bob.post(f"/runs/{gated.pk}/steps/qa/approve/",
                      {"via": "web", "evidence_digest": seen}, HTTP_HX_REQUEST="true")
    refusal = html.unescape(answer.content.decode())
    assert "changed after it was shown to you" in refusal
    assert 'What changed: artifact: "a.tgz" → "b.tgz".' in refusal
    assert not Approval.objects.exists()
    fresh = state(gated).evidence_digest
    page = bob.get("/").content.decode()
    assert f'name="evidence_digest" value="{fresh}"' in page
    bob.post(f"/runs/{gated.pk}/steps/qa/approve/", {"via": "web", "evidence_digest": fresh})
    assert Approval.objects.get().evidence_digest == fresh


def test_the_card_and_a_late_page_say_what_changed(gated, people):
    bob, carol = Client(), Client()
    bob.force_login(people["bob"])
    carol.force_login(people["carol"])
    seen = state(gated).evidence_digest
    engine.approve(gated, "qa", user=people["bob"])
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "b.tgz"})
    why = "Approvals by bob went stale: artifact changed after they decided (attempt 1)."
    assert state(gated).last_summary == why
    assert f"Attempt 2. <bdi>{why}</bdi>" in bob.get("/").content.decode()
    answer = carol.post(f"/runs/{gated.pk}/steps/qa/approve/",
                        {"via": "web", "evidence_digest": seen}, HTTP_HX_REQUEST="true")
    assert why in html.unescape(answer.content.decode())
    assert not Approval.objects.filter(user=people["carol"]).exists()


def test_the_api_shows_the_digest_and_refuses_a_decision_on_an_older_one(gated, people):
    from tests.api.conftest import Api

    api = Api(people["bob"])
    [gate] = [s for s in api.get(f"/api/runs/{gated.pk}").json()["steps"] if s["key"] == "qa"]
    seen = gate["evidence_digest"]
    assert seen == state(gated).evidence_digest and len(seen) == 64
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "b.tgz"})
    late = api.post(f"/api/runs/{gated.pk}/steps/qa/approve", {"seen": seen})
    assert late.status_code == 409 and "changed after" in late.json()["error"]
    assert 'artifact: "a.tgz" → "b.tgz"' in late.json()["error"]
    late = api.post(f"/api/runs/{gated.pk}/steps/qa/reject", {"comment": "no", "seen": seen})
    assert late.status_code == 409
    assert not Approval.objects.exists()
    fresh = api.post(f"/api/runs/{gated.pk}/steps/qa/approve",
                     {"seen": state(gated).evidence_digest})
    assert fresh.status_code == 200 and Approval.objects.get().user == people["bob"]


@pytest.mark.raw_decisions
def test_every_door_refuses_a_decision_that_does_not_say_what_it_was_shown(gated, people):
    """The API requires `seen`; a page's form, a bulk checkbox and a chat press without the
    digest they were drawn with decide nothing either."""
    from tests.api.conftest import Api

    api = Api(people["bob"])
    refused = api.post(f"/api/runs/{gated.pk}/steps/qa/approve", {"comment": "ok"})
    assert refused.status_code == 400 and "seen" in refused.json()["error"]
    bob = Client()
    bob.force_login(people["bob"])
    page = bob.post(f"/runs/{gated.pk}/steps/qa/approve/", {"via": "web"},
                    HTTP_HX_REQUEST="true")
    assert "Say which evidence of qa you decided on" in html.unescape(page.content.decode())
    gate = state(gated)
    bob.post("/inbox/decide/", {"gate": [gate.pk], "decision": "approve"})
    assert not Approval.objects.exists()


def test_bulk_and_chat_refuse_a_decision_on_evidence_changed_since_it_was_shown(gated, people):
    """Nobody had approved, so the change started no new attempt: the digest the bulk
    checkbox's card and the chat button carry is what stops a decision on v2 made on v1."""
    from workflows.chat.base import Press
    from workflows.chat.interactions import _decide

    bob = Client()
    bob.force_login(people["bob"])
    gate = state(gated)
    seen = gate.evidence_digest
    engine.record_transition(gated, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "v2-EVIL.tgz"})
    assert state(gated).attempt == 1 and state(gated).evidence_digest != seen
    bob.post("/inbox/decide/", {"gate": [gate.pk], f"seen-{gate.pk}": seen,
                                "decision": "approve"})
    told = []

    class Chat:
        name = "slack"

        def tell(self, press, text):
            told.append(text)

    from workflows.models import ChatIdentity

    ChatIdentity.objects.create(provider="slack", team="T1", chat_user="U-bob",
                                user=people["bob"], matched_by="link")
    press = Press("button", "approve", gate.pk, gate.attempt, team="T1", chat_user="U-bob",
                  chat_name="bob", channel="C1", seen=seen)
    assert _decide(Chat(), press).startswith("refused")
    assert 'artifact: "a.tgz" → "v2-EVIL.tgz"' in told[-1]
    assert not Approval.objects.exists()


def test_the_card_shows_the_value_as_it_is_now_and_who_changed_it(people):
    """The trail showed what the step before the gate wrote, after another step had changed
    it: the card, the mail and chat show the value approvers decide on, and who changed it."""
    from workflows.chat.messages import gate_message

    store_spec({"name": "rebuilt", "steps": [
        {"key": "build", "title": "Build"},
        {"key": "qa", "depends_on": ["build"], "approval": {"group": "qa"}},
        {"key": "notes", "title": "Release notes"}]})
    run = engine.open_run("rebuilt", actor=people["alice"]).run
    engine.record_transition(run, "build", actor="agent", step_status="completed",
                             state_patch={"artifact": "tollgate.tar.gz"})
    engine.record_transition(run, "notes", actor="agent", step_status="running",
                             state_patch={"artifact": "tollgate-rebuilt.tar.gz"})
    bob = Client()
    bob.force_login(people["bob"])
    card = html.unescape(bob.get("/").content.decode())
    assert "tollgate-rebuilt.tar.gz" in card
    assert "changed by Release notes; Build wrote <bdi>tollgate.tar.gz</bdi>" in card
    message = gate_message(Step.objects.select_related("run").get(run=run, key="qa"))
    assert ("artifact = tollgate-rebuilt.tar.gz (changed by Release notes; Build wrote "
            "tollgate.tar.gz)") in message.trail[0]

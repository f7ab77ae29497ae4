"""A gate with approval.signature is decided only with a fresh proof of who decides: the
person's password re-entered on the page (counted as a sign-in). The record keeps the
signer's name, the time, the meaning, the method and a digest of what was signed; the card,
the run page and the audit export show them; the API, chat and bulk decisions cannot sign."""

from __future__ import annotations

import re

import pytest
from axes.models import AccessAttempt

from tests.api.conftest import Api
from tests.web.conftest import MEANING, signed_in
from workflows import engine
from workflows.models import Approval, Channel, Checkpoint
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError

pytestmark = pytest.mark.django_db


def test_a_signature_names_its_meaning(db):
    for bad in ({}, {"meaning": ""}, {"meaning": "x" * 201}, {"meaning": "ok", "by": "me"},
                "yes"):
        with pytest.raises(SpecError, match="signature must be"):
            store_spec({"name": "bad", "steps": [
                {"key": "qa", "approval": {"group": "qa", "signature": bad}}]})


def test_the_page_asks_for_the_password_and_a_session_alone_cannot_sign(signed_gate, people):
    bob = signed_in(people["bob"])
    inbox = bob.get("/").content.decode()
    assert f"Sign: {MEANING}" in inbox and 'name="signature_password"' in inbox
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", {"via": "web"},
                      HTTP_HX_REQUEST="true")
    assert "must be signed" in answer.content.decode()
    assert not Approval.objects.exists()


def test_a_wrong_password_decides_nothing_and_counts_as_a_failed_sign_in(signed_gate, people):
    bob = signed_in(people["bob"])
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/",
                      {"via": "web", "signature_password": "pw-carol"}, HTTP_HX_REQUEST="true")
    assert "not your password" in answer.content.decode()
    assert not Approval.objects.exists()
    assert AccessAttempt.objects.get(username="bob").failures_since_start == 1


def test_a_signed_approval_records_and_shows_who_when_and_what_it_means(signed_gate, people):
    bob = signed_in(people["bob"])
    bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/",
             {"via": "run_page", "comment": "ship it", "signature_password": "pw-bob"})
    approval = Approval.objects.get()
    assert (approval.signature_meaning, approval.signature_method, approval.signer_name) == (
        MEANING, "password", "Bob Builder")
    assert len(approval.signature_digest) == 64
    checkpoint = Checkpoint.objects.get(run=signed_gate, kind="step_approved")
    assert checkpoint.evidence["signature"]["digest"] == approval.signature_digest
    assert f"signed by Bob Builder: {MEANING}" in checkpoint.summary
    page = re.sub(r"</?bdi>", "", bob.get(signed_gate.get_absolute_url()).content.decode())
    assert f"signed “{MEANING}” as Bob Builder (bob) at " in page
    audit = bob.get(f"/runs/{signed_gate.pk}/audit/").json()
    assert audit["decisions"][0] | {
        "signature_meaning": MEANING, "signer_name": "Bob Builder",
        "signature_method": "password"} == audit["decisions"][0]


def test_a_signed_rejection_means_a_rejection(signed_gate, people):
    """A rejection is never recorded with the approval's meaning: "Rejected" unless the
    spec says what signing a rejection means."""
    bob = signed_in(people["bob"])
    card = bob.get("/").content.decode()
    assert f"Sign: {MEANING}" in card and "Sign: Rejected" in card
    bob.post(f"/runs/{signed_gate.pk}/steps/qa/reject/",
             {"comment": "not yet", "signature_password": "pw-bob"})
    assert Approval.objects.get().signature_meaning == "Rejected"
    signed_gate.refresh_from_db()
    assert signed_gate.status == "failed"
    rejected = Checkpoint.objects.get(run=signed_gate, kind="step_rejected")
    assert rejected.evidence["signature"]["meaning"] == "Rejected"


def test_a_rejection_signed_with_its_own_meaning(people):
    spec = store_spec({"name": "signed-both", "steps": [{"key": "qa", "approval": {
        "group": "qa", "signature": {"meaning": MEANING,
                                     "reject_meaning": "Release refused"}}}]})[0]
    run = engine.open_run(spec, actor=people["alice"]).run
    signed_in(people["bob"]).post(f"/runs/{run.pk}/steps/qa/reject/",
                                  {"comment": "not yet", "signature_password": "pw-bob"})
    assert Approval.objects.get().signature_meaning == "Release refused"
    with pytest.raises(SpecError, match="reject_meaning"):
        store_spec({"name": "bad", "steps": [{"key": "qa", "approval": {
            "group": "qa", "signature": {"meaning": "ok", "reject_meaning": ""}}}]})


def test_the_api_chat_and_bulk_cannot_sign(signed_gate, people):
    answer = Api(people["bob"]).post(f"/api/runs/{signed_gate.pk}/steps/qa/approve", {})
    assert answer.status_code == 403 and "must be signed" in answer.json()["error"]
    with pytest.raises(engine.NotPermitted, match="must be signed"):
        engine.approve(signed_gate, "qa", user=people["bob"], channel=Channel.CHAT,
                       chat_identity="slack:T1/U2")
    gate = signed_gate.steps.get(key="qa")
    decided, refused = engine.decide_many([gate.pk], user=people["bob"], decision="approve",
                                          seen={gate.pk: gate.evidence_digest})
    assert decided == [] and "must be signed" in refused[gate.pk]
    assert not Approval.objects.exists()


def test_a_signature_is_only_its_makers(signed_gate, people):
    carol_proof = engine.Signature(people["carol"].pk, "password")
    with pytest.raises(engine.NotPermitted, match="must be signed"):
        engine.approve(signed_gate, "qa", user=people["bob"], signature=carol_proof)


def test_mail_and_chat_show_who_signed_when_and_what_it_means(people):
    """A gate needing two: after the first signed approval, the chat message and the mail
    about the gate name the signature (Part 11's manifestation)."""
    from zoneinfo import ZoneInfo

    from workflows.chat.messages import gate_message
    from workflows.delivery.notifications import _gate_brief, render

    spec = store_spec({"name": "two-signed", "steps": [
        {"key": "qa", "approval": {"group": "qa", "required": 2,
                                   "signature": {"meaning": MEANING}}}]})[0]
    people["bob"].first_name, people["bob"].last_name = "Bob", "Builder"
    people["bob"].save()
    run = engine.open_run(spec, actor=people["alice"]).run
    engine.approve(run, "qa", user=people["bob"],
                   signature=engine.Signature(people["bob"].pk, "password"))
    gate = run.steps.get(key="qa")
    line = f"signed “{MEANING}” as Bob Builder (bob) at "
    assert any(line in d for d in gate_message(gate).decisions)
    text, html = render("gate_waiting", {"gate": _gate_brief(run, gate), "run": run},
                         ZoneInfo("UTC"))
    assert line in text and "by password" in text


def test_one_rule_can_be_signed_and_the_others_not(people):
    """`signature` on one rule: the managers' approval is signed with its meaning, QA's is
    not, and each card asks only what that person's decision needs."""
    spec = store_spec({"name": "change", "steps": [{"key": "qa", "approval": {"rules": [
        {"group": "qa", "label": "QA"},
        {"group": "managers", "label": "Change board",
         "signature": {"meaning": "Change approved for production"}}]}}]})[0]
    run = engine.open_run(spec, actor=people["alice"], title="Change 7").run
    bob, dave = signed_in(people["bob"]), signed_in(people["dave"])
    assert "Sign:" not in bob.get("/").content.decode()
    assert "Sign: Change approved for production" in dave.get("/").content.decode()
    assert "Sign: Change approved for production" in dave.get(
        run.get_absolute_url()).content.decode()
    bob.post(f"/runs/{run.pk}/steps/qa/approve/", {"comment": "tested"})
    answer = dave.post(f"/runs/{run.pk}/steps/qa/approve/", {}, HTTP_HX_REQUEST="true")
    assert "must be signed (Change approved for production)" in answer.content.decode()
    dave.post(f"/runs/{run.pk}/steps/qa/approve/", {"signature_password": "pw-dave"})
    qa, board = Approval.objects.order_by("pk")
    assert (qa.user, qa.signature_meaning) == (people["bob"], "")
    assert (board.user, board.signature_meaning, board.signature_method) == (
        people["dave"], "Change approved for production", "password")
    run.refresh_from_db()
    assert run.status == "completed"


def test_a_rules_signature_is_checked_as_a_gates(db):
    with pytest.raises(SpecError, match="rule 1: signature must be"):
        store_spec({"name": "bad", "steps": [{"key": "qa", "approval": {"rules": [
            {"group": "qa", "signature": {"meaning": ""}}]}}]})

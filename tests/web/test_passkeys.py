"""Passkeys sign decisions: registered on the profile (their public key kept, nothing else),
then asked to sign a challenge that is the digest of the very form being sent and a nonce
the session keeps once. Driven by a software authenticator through the test client; the
browser test drives Chromium's virtual one."""

from __future__ import annotations

import json

import pytest
from axes.models import AccessAttempt
from django.test import Client

from tests.support.authenticator import Authenticator
from tests.web.conftest import MEANING, signed_in
from workflows.models import Approval, Passkey

pytestmark = pytest.mark.django_db


def add_passkey(client: Client, name: str = "laptop") -> Authenticator:
    key = Authenticator()
    options = client.post("/profile/passkeys/options/").json()
    assert options["rp"]["id"] == "testserver"
    assert options["authenticatorSelection"]["userVerification"] == "required"
    answer = client.post("/profile/passkeys/", {"name": name, "credential": key.create(options)},
                         follow=True)
    assert f"Passkey “{name}” added" in answer.content.decode()
    return key


def sign(client: Client, key: Authenticator, run, verb: str, form: dict) -> dict:
    """Ask for the challenge with the form's fields, sign it; the form as it is then sent."""
    answer = client.post(f"/runs/{run.pk}/steps/qa/{verb}/passkey/", form)
    assert answer.status_code == 200, answer.content
    return {**form, "signature_passkey": key.get(answer.json())}


def test_a_passkey_is_added_with_its_public_key_only_and_removed(people):
    bob = signed_in(people["bob"])
    add_passkey(bob)
    passkey = Passkey.objects.get(user=people["bob"])
    assert passkey.name == "laptop" and len(bytes(passkey.public_key)) > 60
    assert "laptop" in bob.get("/profile/").content.decode()
    bob.post(f"/profile/passkeys/{passkey.pk}/remove/")
    assert not Passkey.objects.exists()


def test_an_answer_to_no_challenge_or_a_forged_one_adds_nothing(people):
    bob = signed_in(people["bob"])
    key = Authenticator()
    options = {"rp": {"id": "testserver"}, "challenge": "bm90LWFza2Vk"}
    answer = bob.post("/profile/passkeys/", {"name": "x", "credential": key.create(options)},
                      follow=True)
    assert "No passkey was being added" in answer.content.decode()
    real = bob.post("/profile/passkeys/options/").json()
    forged = bob.post("/profile/passkeys/", {"name": "x", "credential": key.create(
        {**real, "challenge": "b3RoZXI"})}, follow=True)
    assert "did not verify" in forged.content.decode()
    garbage = bob.post("/profile/passkeys/", {"name": "x", "credential": "{"}, follow=True)
    assert "No passkey was being added" in garbage.content.decode()  # the challenge was spent
    assert not Passkey.objects.exists()


def test_a_passkey_signs_the_decision_and_the_record_says_so(signed_gate, people):
    bob = signed_in(people["bob"])
    key = add_passkey(bob)
    inbox = bob.get("/").content.decode()
    assert "or sign with a passkey" in inbox
    bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/",
             sign(bob, key, signed_gate, "approve", {"via": "web", "comment": "ship it"}))
    approval = Approval.objects.get()
    assert (approval.signature_meaning, approval.signature_method, approval.comment) == (
        MEANING, "passkey", "ship it")
    passkey = Passkey.objects.get()
    assert passkey.sign_count == key.count and passkey.last_used_at is not None


def test_a_signature_covers_the_form_as_asked_for(signed_gate, people):
    """A comment changed after the passkey signed (or the decision turned round) is not what
    was signed: refused, nothing decided, and counted as a failed signature."""
    bob = signed_in(people["bob"])
    key = add_passkey(bob)
    sent = sign(bob, key, signed_gate, "approve", {"comment": "looks fine"})
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/",
                      {**sent, "comment": "looks fine, but skip the tests"},
                      HTTP_HX_REQUEST="true")
    assert "does not verify" in answer.content.decode()
    sent = sign(bob, key, signed_gate, "approve", {"comment": "x"})
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/reject/", sent, HTTP_HX_REQUEST="true")
    assert "does not verify" in answer.content.decode()
    assert not Approval.objects.exists()
    assert AccessAttempt.objects.get(username="bob").failures_since_start == 2


def test_a_signature_is_spent_once_and_only_in_its_session(signed_gate, people):
    bob = signed_in(people["bob"])
    key = add_passkey(bob)
    sent = sign(bob, key, signed_gate, "approve", {"comment": "ok"})
    elsewhere = signed_in(people["bob"])  # a copied assertion, sent from another session
    answer = elsewhere.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", sent,
                            HTTP_HX_REQUEST="true")
    assert "no signing was started" in answer.content.decode()
    bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", {**sent, "comment": "changed"})
    again = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", sent, HTTP_HX_REQUEST="true")
    assert "no signing was started" in again.content.decode()  # its nonce was spent
    assert not Approval.objects.exists()


def test_only_ones_own_passkey_signs(signed_gate, people):
    carol = signed_in(people["carol"])
    carols = add_passkey(carol)
    bob = signed_in(people["bob"])
    add_passkey(bob)
    options = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/passkey/", {}).json()
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/",
                      {"signature_passkey": carols.get(options)}, HTTP_HX_REQUEST="true")
    assert "not one of your passkeys" in answer.content.decode()
    assert not Approval.objects.exists()


def test_failed_signatures_lock_the_account_out_as_failed_sign_ins(signed_gate, people,
                                                                    settings):
    bob = signed_in(people["bob"])
    key = add_passkey(bob)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        sent = sign(bob, key, signed_gate, "approve", {"comment": "a"})
        bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", {**sent, "comment": "b"})
    sent = sign(bob, key, signed_gate, "approve", {"comment": "a"})
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", sent, HTTP_HX_REQUEST="true")
    assert "locked" in answer.content.decode()
    assert not Approval.objects.exists()


def test_without_a_passkey_the_page_offers_none_and_asking_is_refused(signed_gate, people):
    bob = signed_in(people["bob"])
    assert "or sign with a passkey" not in bob.get("/").content.decode()
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/passkey/", {})
    assert answer.status_code == 400 and "no passkey" in json.loads(answer.content)["error"]


def test_only_a_fresh_sign_in_adds_a_passkey(people, settings):
    """A session cookie stolen, or a desk left open, an hour on cannot enrol a key of its own."""
    from workflows.people.sessions import SIGNED_IN_AT

    bob = signed_in(people["bob"])
    session = bob.session
    session[SIGNED_IN_AT] -= settings.TOLLGATE_PASSKEY_ENROL_SECONDS + 1
    session.save()
    answer = bob.post("/profile/passkeys/options/")
    assert answer.status_code == 403 and "sign in again" in answer.json()["error"]
    key = Authenticator()
    refused = bob.post("/profile/passkeys/", {"name": "x", "credential": key.create(
        {"rp": {"id": "testserver"}, "challenge": "eA"})}, follow=True)
    assert "sign in again" in refused.content.decode()
    assert not Passkey.objects.exists()


def test_only_a_fresh_sign_in_removes_a_passkey(people, settings):
    """Nor can it take the person's own key away (to sign without it, or lock them out)."""
    from workflows.people.sessions import SIGNED_IN_AT

    bob = signed_in(people["bob"])
    add_passkey(bob)
    passkey = Passkey.objects.get()
    session = bob.session
    session[SIGNED_IN_AT] -= settings.TOLLGATE_PASSKEY_ENROL_SECONDS + 1
    session.save()
    refused = bob.post(f"/profile/passkeys/{passkey.pk}/remove/", follow=True)
    assert "Removing a passkey needs a sign-in" in refused.content.decode()
    assert Passkey.objects.filter(pk=passkey.pk).exists()
    assert signed_in(people["carol"]).post(
        f"/profile/passkeys/{passkey.pk}/remove/").status_code == 404

"""Signing a decision by signing in again at the company's provider (for people who sign in
only there): the decision waits in the session, the provider is asked for a sign-in made now
(max_age=0, prompt=login), and it is made, signed "sign-on", only if the provider vouches for
the same person with an auth_time after it was asked for. The provider here answers as told;
tests/browser/test_sign_on.py goes through a real one."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.http import HttpResponseRedirect
from django.test import Client

from tests.conftest import make_user
from tests.web.conftest import MEANING
from workflows.models import Approval, SsoIdentity
from workflows.sso import views

pytestmark = pytest.mark.django_db

ISSUER = "https://id.acme.test"


class Provider:
    """The provider's client as the sign-in views use it, answering as told."""

    def __init__(self):
        self.asked, self.claims, self.states = [], {}, []

    def authorize_redirect(self, request, redirect_uri, **extra):
        self.asked.append(extra)
        self.states.append(f"state-{len(self.states)}")
        return HttpResponseRedirect(f"{ISSUER}/auth?state={self.states[-1]}")

    def authorize_access_token(self, request):
        return {"id_token": "x", "userinfo": {**self.claims, "groups": []}}

    def userinfo(self, token):
        return {}


@pytest.fixture
def provider(settings, monkeypatch):
    settings.TOLLGATE_OIDC_ISSUER = ISSUER
    settings.TOLLGATE_OIDC_LABEL = "Acme"
    fake = Provider()
    monkeypatch.setattr(views.provider, "client", lambda: fake)
    return fake


@pytest.fixture
def sam(db):
    """Someone who signs in only at the provider (no password), in qa."""
    user = make_user("sam", "qa")
    user.set_unusable_password()
    user.save()
    SsoIdentity.objects.create(user=user, issuer=ISSUER, subject="sam-sub",
                               email="sam@acme.test", email_verified=True)
    return user


def decide(client: Client, run, decision="approve", **fields) -> str:
    """Press "sign in again" on the card: the page that says what is about to be signed."""
    answer = client.post(f"/runs/{run.pk}/steps/qa/{decision}/",
                         {"via": "web", "sign_at_provider": "1", **fields})
    assert answer.status_code == 302 and answer["Location"].startswith("/sign/")
    return answer["Location"]


def go(client: Client, confirm: str, provider) -> str:
    """Press its one button: off to the provider, for that decision; the round trip's state."""
    page = client.get(confirm)
    binding = confirm.strip("/").split("/")[-1]
    assert f'value="{binding}"' in page.content.decode()
    answer = client.post("/sso/sign/", {"purpose": binding, "next": "/sign/complete/"})
    assert answer["Location"] == f"{ISSUER}/auth?state={provider.states[-1]}"
    assert provider.asked[-1] == {"max_age": 0, "prompt": "login"}
    return provider.states[-1]


def ask(client: Client, run, provider, decision="approve", **fields) -> str:
    return go(client, decide(client, run, decision, **fields), provider)


def back(client: Client, provider, state: str = "", **claims):
    provider.claims = {"sub": "sam-sub", "email": "sam@acme.test", "email_verified": True,
                       **claims}
    return client.get(f"/sso/callback/?code=c&state={state or provider.states[-1]}",
                      follow=True)


def test_the_card_offers_it_only_to_those_who_sign_on(provider, sam, people, signed_gate):
    client = Client()
    client.force_login(sam)
    page = client.get("/").content.decode()
    # The one way sam signs, as the primary action.
    assert ('<button class="primary" name="sign_at_provider" value="1" formnovalidate>Sign in '
            'again at Acme to sign</button>') in page and 'name="signature_password"' not in page
    bob = Client()
    bob.force_login(people["bob"])
    assert "or sign in again at" not in bob.get("/").content.decode()
    answer = bob.post(f"/runs/{signed_gate.pk}/steps/qa/approve/", {"sign_at_provider": "1"},
                      follow=True)
    assert "do not sign in through the company" in answer.content.decode()


def test_a_fresh_sign_in_at_the_provider_signs_the_waiting_decision(provider, sam, signed_gate):
    client = Client()
    client.force_login(sam)
    confirm = decide(client, signed_gate, comment="release notes read")
    shown = client.get(confirm).content.decode()
    assert "Sign your approval of qa" in shown and MEANING in shown
    assert "release notes read" in shown
    go(client, confirm, provider)
    page = back(client, provider, auth_time=int(time.time()))
    assert "You approved qa" in page.content.decode()
    approval = Approval.objects.get()
    assert (approval.user, approval.signature_meaning, approval.signature_method,
            approval.comment) == (sam, MEANING, "sign-on", "release notes read")
    again = client.get("/sign/complete/", follow=True)  # the signature is spent
    assert "No decision is waiting" in again.content.decode()


def test_a_sign_in_the_provider_did_not_make_afresh_signs_nothing(provider, sam, signed_gate):
    client = Client()
    client.force_login(sam)
    ask(client, signed_gate, provider)
    page = back(client, provider, auth_time=int(time.time()) - 3600)
    assert "its sign-in predates this decision" in page.content.decode()
    ask(client, signed_gate, provider)
    page = back(client, provider)  # no auth_time at all
    assert "did not vouch for you" in page.content.decode()
    assert not Approval.objects.exists()


def test_another_person_coming_back_signs_nothing(provider, sam, signed_gate, people):
    SsoIdentity.objects.create(user=people["bob"], issuer=ISSUER, subject="bob-sub")
    client = Client()
    client.force_login(sam)
    ask(client, signed_gate, provider)
    page = back(client, provider, sub="bob-sub", auth_time=int(time.time()))
    assert "did not vouch for you" in page.content.decode()
    assert not Approval.objects.exists()


def test_a_rejection_needs_its_comment_before_going_anywhere(provider, sam, signed_gate):
    client = Client()
    client.force_login(sam)
    answer = client.post(f"/runs/{signed_gate.pk}/steps/qa/reject/", {"sign_at_provider": "1"},
                         HTTP_HX_REQUEST="true")
    assert "A comment is required to reject" in answer.content.decode()
    assert provider.asked == []


def test_a_signed_rejection_says_what_a_rejection_means(provider, sam, signed_gate):
    client = Client()
    client.force_login(sam)
    confirm = decide(client, signed_gate, "reject", comment="notes are missing")
    shown = client.get(confirm).content.decode()
    assert "Sign your rejection of qa" in shown and "Rejected" in shown
    assert MEANING not in shown
    go(client, confirm, provider)
    back(client, provider, auth_time=int(time.time()))
    rejection = Approval.objects.get()
    assert (rejection.decision, rejection.signature_meaning) == ("reject", "Rejected")


def test_a_link_to_the_round_trip_signs_nothing_by_being_opened(provider, sam, signed_gate,
                                                                people):
    """A thief holding the session cookie leaves their own decision waiting and sends the
    victim a link on Tollgate's own host: opening it shows what would be signed and starts
    nothing; the old GET door is gone."""
    client = Client()
    client.force_login(sam)
    confirm = decide(client, signed_gate, comment="the thief's words")
    assert client.get(confirm).status_code == 200 and provider.asked == []
    assert client.get("/sso/sign/?next=/sign/complete/").status_code == 405
    assert provider.asked == []
    assert not Approval.objects.exists()


def test_the_round_trip_signs_only_the_decision_it_was_started_for(provider, sam, signed_gate):
    """The person starts signing their decision; a thief with the same session cookie leaves
    another one waiting meanwhile (and even starts its round trip): the person's return
    signs their own decision, never the thief's."""
    victim, thief = Client(), Client()
    victim.force_login(sam)
    theirs = decide(victim, signed_gate, comment="mine: notes read")
    state = go(victim, theirs, provider)
    thief.cookies[settings.SESSION_COOKIE_NAME] = victim.cookies[settings.SESSION_COOKIE_NAME]
    go(thief, decide(thief, signed_gate, "reject", comment="the thief's"), provider)
    back(victim, provider, state=state, auth_time=int(time.time()))
    approval = Approval.objects.get()
    assert (approval.decision, approval.comment) == ("approve", "mine: notes read")


def test_a_round_trip_completed_in_another_browser_vouches_for_nothing(provider, sam,
                                                                       signed_gate):
    """The thief starts the round trip for their decision and sends the provider's link to
    the victim, who signs in there: back in the victim's browser (the same session, not the
    browser that started it) nothing is signed."""
    victim, thief = Client(), Client()
    victim.force_login(sam)
    thief.cookies[settings.SESSION_COOKIE_NAME] = victim.cookies[settings.SESSION_COOKIE_NAME]
    state = ask(thief, signed_gate, provider, comment="the thief's")
    page = back(victim, provider, state=state, auth_time=int(time.time()))
    assert "did not vouch for you" in page.content.decode()
    assert not Approval.objects.exists()

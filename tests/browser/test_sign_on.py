"""Sign-in with the company's OpenID Connect provider, in Chromium through the provider's own
login page: accounts made on first sign-in, groups from the claim (and taken away when the
provider takes them away), break-glass passwords, SSO-only mode, sign-out at the provider."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import RELEASE, make_user
from workflows import engine
from workflows.errors import NotPermitted
from workflows.models import SsoIdentity
from workflows.people.sessions import SIGNED_IN_AT
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def sign_in_at_provider(page, login: str) -> None:
    """From Tollgate's sign-in page, through the provider's login page and back."""
    page.click("a:has-text('Sign in with Acme')")
    page.wait_for_selector("input[name=login]")
    assert page.url.startswith("http://127.0.0.1:") and "/interaction/" in page.url
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "the provider checks this, not Tollgate")
    page.click("button:has-text('Sign-in')")


def back_at_tollgate(page) -> None:
    page.wait_for_url(lambda url: url.startswith(settings.TOLLGATE_BASE_URL)
                      and "/login" not in url)


def waiting_release():
    store_spec(RELEASE)
    requester = make_user("rita", perms=("add_run",))
    run = engine.open_run("release", actor=requester, title="Release 7").run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    return run


def test_first_sign_in_makes_the_account_and_groups_follow_the_provider(oidc_provider, page):
    run = waiting_release()
    oidc_provider.set_users({"ann": {"email": "ann@acme.test", "groups": ["qa", "staff-x"],
                                     "given_name": "Ann", "family_name": "Lee"}})
    page.goto("/runs/")
    assert "/login/" in page.url
    sign_in_at_provider(page, "ann")
    page.wait_for_url("**/runs/")  # back where she was going
    ann = User.objects.get(username="ann")
    assert (ann.email, ann.first_name, ann.has_usable_password()) == ("ann@acme.test", "Ann",
                                                                      False)
    assert set(ann.groups.values_list("name", flat=True)) == {"qa", "staff-x"}
    identity = SsoIdentity.objects.get(user=ann)
    assert identity.issuer == oidc_provider.url and identity.email_verified
    page.goto("/")
    assert page.locator(f"#gate-{run.steps.get(key='qa').pk}").is_visible()

    # Sign-out ends the provider's session too: the provider asks to confirm, then sends
    # her back to Tollgate's sign-in page.
    page.click("form.who button")
    page.click("button:has-text('Yes, sign me out')")
    page.wait_for_url("**/login/**")

    # The provider takes qa away; at her next sign-in she can no longer decide its gates.
    oidc_provider.set_users({"ann": {"email": "ann@acme.test", "groups": ["staff-x"]}})
    page.goto("/")
    sign_in_at_provider(page, "ann")  # a new provider session: its login page again
    back_at_tollgate(page)
    assert set(ann.groups.values_list("name", flat=True)) == {"staff-x"}
    assert page.locator(f"#gate-{run.steps.get(key='qa').pk}").count() == 0
    with pytest.raises(NotPermitted):
        engine.approve(run, "qa", user=User.objects.get(username="ann"))
    assert User.objects.filter(username__startswith="ann").count() == 1  # the same account


def test_a_mapped_claim_manages_only_its_groups(oidc_provider, page, settings):
    settings.TOLLGATE_OIDC_GROUP_MAP = {"6f1c-qa-guid": "qa"}
    bea = make_user("bea", "local-team")
    bea.email = "bea@acme.test"
    bea.save()
    oidc_provider.set_users({"b.lee": {"email": "bea@acme.test", "groups": ["6f1c-qa-guid",
                                                                          "unmapped"]}})
    page.goto("/login/")
    sign_in_at_provider(page, "b.lee")
    back_at_tollgate(page)
    # Linked to her existing account by the verified e-mail; the local group stays.
    assert set(bea.groups.values_list("name", flat=True)) == {"local-team", "qa"}
    assert SsoIdentity.objects.get(subject="b.lee").user == bea


def test_sso_only_refuses_passwords_but_for_break_glass(oidc_provider, page, settings):
    settings.TOLLGATE_OIDC_ONLY = True
    settings.TOLLGATE_BREAK_GLASS = ["root"]
    make_user("bob", "qa")
    make_user("root", is_staff=True, is_superuser=True)
    page.goto("/login/")
    page.click("summary:has-text('Break-glass')")
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", "pw-bob")
    page.click("button:has-text('Sign in with a password')")
    assert "Signing in with a password is turned off" in page.text_content(".notice.error")
    assert "/login/" in page.url
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "pw-root")
    page.click("button:has-text('Sign in with a password')")
    back_at_tollgate(page)
    # The admin's own login form is refused the same way.
    admin = Client()
    response = admin.post("/admin/login/", {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 200 and "_auth_user_id" not in admin.session


def test_a_session_past_its_age_signs_in_again(settings, db):
    settings.TOLLGATE_SESSION_MAX_AGE = 3600
    client = Client()
    client.force_login(make_user("cy"))
    assert client.get("/").status_code == 200
    session = client.session
    session[SIGNED_IN_AT] = int(time.time()) - 3601
    session.save()
    response = client.get("/runs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get("/").status_code == 302  # signed out, not merely redirected once
    expired = Client()
    expired.force_login(User.objects.get(username="cy"))
    session = expired.session
    session[SIGNED_IN_AT] = 0
    session.save()
    assert expired.get("/", headers={"HX-Request": "true"})["HX-Redirect"].startswith("/login/")


def test_a_forged_callback_is_refused_clearly(oidc_provider):
    response = Client().get("/sso/callback/?code=made-up&state=made-up")
    assert response.status_code == 400
    assert "The sign-in did not complete" in response.content.decode()
    assert not User.objects.exists()


def test_a_session_is_checked_at_the_provider_again(oidc_provider, page, settings):
    """The provider takes qa away, then removes ann: her open session follows at its next
    check (a silent round trip, no login page), not at her next sign-in."""
    run = waiting_release()
    gate = f"#gate-{run.steps.get(key='qa').pk}"
    oidc_provider.set_users({"ann": {"email": "ann@acme.test", "groups": ["qa"]}})
    page.goto("/login/")
    sign_in_at_provider(page, "ann")
    back_at_tollgate(page)
    page.goto("/")
    assert page.locator(gate).is_visible()

    page.goto("/profile/")  # a page that does not poll: the next step makes the check
    oidc_provider.set_users({"ann": {"email": "ann@acme.test", "groups": []}})
    settings.TOLLGATE_OIDC_RECHECK_SECONDS = 1
    time.sleep(1.1)  # the session is now older than a check lasts
    visited = []
    page.on("request", lambda request: visited.append(request.url))
    page.goto("/")  # through the provider's redirects, and back
    assert page.url == f"{settings.TOLLGATE_BASE_URL}/"
    assert any("prompt=none" in url for url in visited)
    assert any("/sso/callback/" in url for url in visited)
    assert not any("/interaction/" in url for url in visited)  # no login page shown
    assert not User.objects.get(username="ann").groups.exists()
    assert page.locator(gate).count() == 0

    page.goto("/profile/")
    oidc_provider.set_users({})  # removed at the provider
    time.sleep(1.1)
    page.goto("/")
    assert "/sso/callback/" in page.url
    assert "Your company sign-in has ended" in page.text_content(".notice.error")
    page.goto("/")
    assert "/login/" in page.url  # the session ended here too


def test_the_provider_lends_no_identity_it_does_not_vouch_for(oidc_provider, page):
    boss = make_user("boss")
    root = make_user("root", is_staff=True, is_superuser=True)
    for user, email in ((boss, "boss@acme.test"), (root, "admin@acme.test")):
        user.email = email
        user.save()
    oidc_provider.set_users({
        "mal": {"email": "boss@acme.test", "email_verified": False},
        "evil": {"email": "ADMIN@acme.test"}})
    page.goto("/login/")
    sign_in_at_provider(page, "mal")
    back_at_tollgate(page)
    mal = SsoIdentity.objects.get(subject="mal").user
    assert mal != boss and mal.email == ""  # neither linked nor given the address

    page.context.clear_cookies()
    page.goto("/login/")
    sign_in_at_provider(page, "evil")
    page.wait_for_url("**/sso/callback/**")
    assert "never joins by itself" in page.text_content(".notice.error")
    assert not SsoIdentity.objects.filter(subject="evil").exists()
    page.goto("/admin/")
    assert "/login/" in page.url


def test_a_signed_gate_is_signed_by_signing_in_again_at_the_provider(oidc_provider, page):
    """Someone with no password signs by signing in again at the provider: its login page
    comes back (max_age=0) even though its session is fresh, and the decision, kept
    meanwhile, is made on return, signed "sign-on"."""
    from workflows.models import Approval

    spec = store_spec({"name": "signed", "steps": [{"key": "qa", "title": "Release sign-off",
                                                      "approval": {"group": "qa", "signature": {
                                                          "meaning": "Approved for release"}}}]})[0]
    requester = make_user("rita", perms=("add_run",))
    engine.open_run(spec, actor=requester, title="Release 8")
    oidc_provider.set_users({"ann": {"email": "ann@acme.test", "groups": ["qa"],
                                     "given_name": "Ann", "family_name": "Lee"}})
    page.goto("/")
    sign_in_at_provider(page, "ann")
    back_at_tollgate(page)
    page.goto("/")
    page.get_by_label("Approval comment for Release sign-off").fill("notes checked")
    page.click("button:has-text('Sign in again at Acme to sign')")
    # What is about to be signed, said in full, and one button that starts it.
    page.wait_for_selector("h1:has-text('Sign your approval of Release sign-off')")
    assert "Approved for release" in page.text_content("dl.signing")
    assert "notes checked" in page.text_content("dl.signing")
    page.click("button:has-text('Sign in again at Acme to sign')")
    page.wait_for_selector("input[name=login]")  # the provider asks again
    page.fill("input[name=login]", "ann")
    page.fill("input[name=password]", "the provider checks this, not Tollgate")
    page.click("button:has-text('Sign-in')")
    page.wait_for_selector("text=You approved Release sign-off")
    approval = Approval.objects.get()
    assert (approval.user.username, approval.signature_method, approval.signer_name,
            approval.comment) == ("ann", "sign-on", "Ann Lee", "notes checked")

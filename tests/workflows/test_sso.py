"""Identity from sign-on only where the provider vouches for it: an unverified e-mail is never
written, linked or matched; a first sign-on never joins an admin's account; userinfo must name
the ID token's subject; every answer that does not verify is a sign-in error, never a 500;
API tokens follow sign-on."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from authlib.integrations.base_client import OAuthError
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from joserfc.errors import BadSignatureError, ExpiredTokenError, InvalidClaimError

from tests.conftest import make_user
from workflows.models import ApiToken, Preference, SsoIdentity
from workflows.sso import views
from workflows.sso.accounts import SignInRefused, sign_in_user

pytestmark = pytest.mark.django_db

ISSUER = "https://id.acme.test"


def claims(sub, email, verified=True, **more):
    return {"sub": sub, "email": email, "email_verified": verified, **more}


class TestUnverifiedEmail:
    def test_is_never_written_to_the_account_nor_kept_on_the_identity(self):
        ann = sign_in_user(claims("a-1", "boss@acme.test", verified=False), ISSUER)
        assert ann.email == ""
        identity = SsoIdentity.objects.get(user=ann)
        assert (identity.email, identity.email_verified) == ("", False)
        sign_in_user(claims("a-1", "ann@acme.test"), ISSUER)  # verified later: written
        sign_in_user(claims("a-1", "boss@acme.test", verified=False), ISSUER)
        ann.refresh_from_db()
        assert ann.email == "ann@acme.test"  # an unverified one does not replace it

    def test_never_links_to_an_existing_account(self):
        boss = make_user("boss")
        boss.email = "boss@acme.test"
        boss.save()
        mallory = sign_in_user(claims("m-1", "boss@acme.test", verified="true"), ISSUER)
        assert mallory != boss and SsoIdentity.objects.get(subject="m-1").user == mallory

    def test_never_names_a_manager_nor_pushes_the_real_one_out(self, settings):
        settings.TOLLGATE_OIDC_MANAGER_CLAIM = "manager_email"
        dave = sign_in_user(claims("d-1", "dave@acme.test"), ISSUER)
        # Someone whose provider account claims dave's address, unverified.
        impostor = sign_in_user(claims("x-1", "dave@acme.test", verified=False), ISSUER)
        rita = sign_in_user(claims("r-1", "rita@acme.test",
                                   manager_email="DAVE@acme.test"), ISSUER)
        assert Preference.objects.get(user=rita).manager == dave != impostor
        # An account e-mail alone (no identity the provider verified) names nobody.
        local = make_user("lou")
        local.email = "lou@acme.test"
        local.save()
        sign_in_user(claims("r-1", "rita@acme.test", manager_email="lou@acme.test"), ISSUER)
        assert Preference.objects.get(user=rita).manager is None


@pytest.mark.parametrize("kind", ["staff", "superuser", "break_glass"])
def test_a_first_sign_on_never_joins_an_admins_account(kind, settings):
    fields = {"staff": {"is_staff": True}, "superuser": {"is_superuser": True},
              "break_glass": {}}[kind]
    admin = make_user("root", **fields)
    admin.email = "ADMIN@acme.test"
    admin.save()
    settings.TOLLGATE_BREAK_GLASS = ["root"] if kind == "break_glass" else []
    with pytest.raises(SignInRefused, match="never joins by itself"):
        sign_in_user(claims("evil", "admin@acme.test"), ISSUER)
    assert not SsoIdentity.objects.exists()
    # An admin links it by hand; from then on that identity signs in as the account.
    SsoIdentity.objects.create(user=admin, issuer=ISSUER, subject="evil")
    assert sign_in_user(claims("evil", "admin@acme.test"), ISSUER) == admin


class FakeClient:
    """The provider's client as the callback uses it, answering as told."""

    def __init__(self, token=None, userinfo=None, error=None):
        self.token, self.info, self.error = token, userinfo, error

    def authorize_access_token(self, request):
        if self.error is not None:
            raise self.error
        return self.token

    def userinfo(self, token):
        return self.info

    def load_server_metadata(self):
        return {}  # no end-session endpoint


@pytest.fixture
def provider(settings, monkeypatch):
    settings.TOLLGATE_OIDC_ISSUER = ISSUER
    fake = FakeClient()
    monkeypatch.setattr(views.provider, "client", lambda: fake)
    return fake


def test_userinfo_must_name_the_id_tokens_subject(provider):
    provider.token = {"id_token": "x", "userinfo": claims("ann", "ann@acme.test")}
    provider.info = claims("root", "root@acme.test", groups=["admins"])
    response = Client().get("/sso/callback/?code=c&state=s")
    assert response.status_code == 403 and "names another person" in response.content.decode()
    assert not User.objects.exists()
    provider.info = {**provider.info, "sub": "ann"}
    assert Client().get("/sso/callback/?code=c&state=s").status_code == 302
    assert User.objects.get().groups.get().name == "admins"


@pytest.mark.parametrize("error", [
    OAuthError(error="invalid_grant", description="code expired"),
    BadSignatureError(), ExpiredTokenError("exp"), InvalidClaimError("aud"), ValueError("padding"),
    KeyError("id_token"), TypeError("not a dict"), RuntimeError('Missing "jwks_uri"'),
    requests.ConnectionError("provider away"),
], ids=lambda e: type(e).__name__)
def test_every_refused_token_is_a_sign_in_error_not_a_500(provider, error):
    provider.error = error
    response = Client().get("/sso/callback/?code=c&state=s")
    assert response.status_code == 400
    assert "The sign-in did not complete" in response.content.decode()
    assert not User.objects.exists()


def test_an_answer_without_an_id_token_signs_nobody_in(provider):
    provider.token = {"access_token": "a"}
    response = Client().get("/sso/callback/?code=c&state=s")
    assert response.status_code == 403 and "no ID token" in response.content.decode()


class TestTokensFollowSignOn:
    def test_a_token_works_while_the_provider_vouches_for_its_person(self, settings):
        settings.TOLLGATE_OIDC_ISSUER = ISSUER
        settings.TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS = 3600
        ann = sign_in_user(claims("a-1", "ann@acme.test"), ISSUER)
        raw = ApiToken.objects.issue(ann, "script")[1]
        api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert api.get("/api/runs").status_code == 200
        # Not seen at the provider for longer than that (disabled there, or removed).
        SsoIdentity.objects.update(last_sign_in=timezone.now() - timedelta(hours=2))
        assert api.get("/api/runs").status_code == 401
        sign_in_user(claims("a-1", "ann@acme.test"), ISSUER)  # she signs in again
        assert api.get("/api/runs").status_code == 200
        # A person with no sign-on identity (a service account) is not affected.
        bot = make_user("bot")
        raw = ApiToken.objects.issue(bot, "ci")[1]
        assert Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/runs").status_code == 200


def test_production_checks_refuse_an_http_issuer(settings):
    from workflows.ops import checks

    settings.TOLLGATE_OIDC_ISSUER = "http://id.acme.test"
    assert [e.id for e in checks.sign_on_issuer(None)] == ["tollgate.E003"]
    settings.TOLLGATE_OIDC_ISSUER = "https://id.acme.test"
    assert checks.sign_on_issuer(None) == []


def test_the_api_description_follows_its_setting(settings):
    settings.TOLLGATE_API_DOCS_PUBLIC = False
    for path in ("/api/openapi.json", "/api/docs"):
        response = Client().get(path)
        assert response.status_code == 401 and "not public" in response.json()["error"]
    signed_in = Client()
    signed_in.force_login(make_user("ann"))
    assert signed_in.get("/api/openapi.json").status_code == 200
    raw = ApiToken.objects.issue(User.objects.get(username="ann"), "t")[1]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(
        "/api/openapi.json").status_code == 200
    settings.TOLLGATE_API_DOCS_PUBLIC = True
    assert Client().get("/api/openapi.json").status_code == 200


def test_signing_out_needs_no_check_at_the_provider_first(provider):
    """A session due for its check at the provider can still sign out at once."""
    from workflows.sso.views import CHECKED_AT, ID_TOKEN

    client = Client()
    client.force_login(make_user("ann"))
    session = client.session
    session[ID_TOKEN], session[CHECKED_AT] = "an-id-token", 0  # long due
    session.save()
    assert "recheck=1" in client.get("/runs/")["Location"]  # pages go through the check
    response = client.post("/logout/")
    assert response.status_code == 302 and "recheck" not in response["Location"]
    assert "_auth_user_id" not in client.session


def test_signing_out_says_so(settings):
    client = Client()
    client.force_login(make_user("ann"))
    page = client.post("/logout/", follow=True).content.decode()
    assert "You are signed out." in page


def test_the_admins_login_page_points_to_sign_on_when_it_is_the_only_way_in(settings):
    settings.TOLLGATE_OIDC_ISSUER = "https://id.acme.test"
    settings.TOLLGATE_OIDC_LABEL = "Acme"
    settings.TOLLGATE_OIDC_ONLY = True
    page = Client().get("/admin/login/?next=/admin/").content.decode()
    assert "This site signs in through Acme" in page and "/sso/login/" in page
    settings.TOLLGATE_OIDC_ONLY = False
    page = Client().get("/admin/login/?next=/admin/").content.decode()
    assert "This site signs in through" not in page and "Sign in with Acme" in page
    settings.TOLLGATE_OIDC_ISSUER = ""
    assert "Sign in with" not in Client().get("/admin/login/").content.decode()

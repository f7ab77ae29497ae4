"""Sign-in through the provider, its callback, and sign-out that ends the provider's session
where it offers one."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from urllib.parse import parse_qs, urlsplit

import requests
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.base_client import OAuthError
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from joserfc.errors import JoseError

from workflows.people.sessions import FRESH_SIGN_IN

from . import provider
from .accounts import SignInRefused, password_allowed, sign_in_user

log = logging.getLogger(__name__)

NEXT = "tollgate_sso_next"
ID_TOKEN = "tollgate_sso_id_token"
# When the provider last vouched for this session's person (see middleware.SsoRecheck), and
# whether the round trip under way is such a check (prompt=none: no page at the provider).
CHECKED_AT = "tollgate_sso_checked_at"
RECHECK = "tollgate_sso_recheck"
# Round trips under way for a fresh sign-in (sign), by their state: what each is for, where it
# goes back to, and the digest of the cookie (BROWSER) of the browser that started it.
SIGNING = "tollgate_sso_signing"
BROWSER = "tollgate_signing"

# What a provider's answer can fail with: its error, a token that does not verify or does
# not parse, a network failure, a malformed document.
TOKEN_ERRORS = (OAuthError, JoseError, AuthlibBaseError, requests.RequestException,
                ValueError, KeyError, TypeError, RuntimeError)


def _absolute(request, name: str) -> str:
    path = reverse(name)
    return (f"{settings.TOLLGATE_BASE_URL}{path}" if settings.TOLLGATE_BASE_URL
            else request.build_absolute_uri(path))


def _safe_next(request, target: str) -> str:
    ok = url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                         require_https=request.is_secure())
    return target if target and ok else reverse(settings.LOGIN_REDIRECT_URL)


class LoginView(auth_views.LoginView):
    """The sign-in page: the company's sign-on button when it is set up, and the password
    form (for break-glass accounts only, when sign-on is the only way in)."""

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "sso": provider.enabled(),
                "sso_label": settings.TOLLGATE_OIDC_LABEL,
                "sso_only": settings.TOLLGATE_OIDC_ONLY}

    def form_invalid(self, form):
        username = form.data.get("username", "")
        if username and not password_allowed(username):
            form.errors.clear()
            form.add_error(None, "Signing in with a password is turned off: use "
                                 f"“Sign in with {settings.TOLLGATE_OIDC_LABEL}”.")
        return super().form_invalid(form)


@login_not_required
@require_GET
def sign_in(request):
    """Off to the provider's sign-in page (state, nonce and PKCE verifier kept in the
    session)."""
    if not provider.enabled():
        raise Http404("Single sign-on is not set up.")
    request.session[NEXT] = request.GET.get("next", "")
    recheck = request.GET.get("recheck") == "1" and request.user.is_authenticated
    request.session[RECHECK] = recheck
    extra = {"prompt": "none"} if recheck else {}
    return provider.client().authorize_redirect(request, _absolute(request, "sso_callback"),
                                                **extra)


@require_POST
def sign(request):
    """Off to the provider to sign in again, now (max_age=0, and prompt=login for the
    providers that ignore it), for `purpose` (what the caller asked a fresh sign-in for:
    a decision waiting for its signature), coming back to `next`. Only this round trip,
    completed in this browser (a cookie set here), vouches for that purpose: a page that
    asked for it reads FRESH_SIGN_IN and checks that it names its purpose."""
    if not provider.enabled():
        raise Http404("Single sign-on is not set up.")
    purpose = request.POST.get("purpose", "")
    if not purpose:
        return HttpResponseBadRequest("Say what the fresh sign-in is for (purpose).")
    request.session.pop(FRESH_SIGN_IN, None)
    response = provider.client().authorize_redirect(
        request, _absolute(request, "sso_callback"), max_age=0, prompt="login")
    state = parse_qs(urlsplit(response["Location"]).query).get("state", [""])[0]
    browser = secrets.token_urlsafe(32)
    trips = dict(request.session.get(SIGNING) or {})
    trips[state] = {"purpose": purpose, "next": request.POST.get("next", ""),
                    "browser": hashlib.sha256(browser.encode()).hexdigest()}
    request.session[SIGNING] = dict(list(trips.items())[-5:])
    response.set_cookie(BROWSER, browser, max_age=600, path=reverse("sso_callback"),
                        secure=settings.SESSION_COOKIE_SECURE, httponly=True, samesite="Lax")
    return response


def _fresh(request, client, trip: dict) -> None:
    """The provider's answer to a round trip for a fresh sign-in: kept (FRESH_SIGN_IN, with
    the ID token's auth_time and the trip's purpose) only if it vouches for the same person
    and came back to the browser that started the trip."""
    browser = hashlib.sha256(request.COOKIES.get(BROWSER, "").encode()).hexdigest()
    if not hmac.compare_digest(browser, trip["browser"]):
        log.warning("A fresh sign-in came back to another browser than the one that asked "
                    "for it: it vouches for nothing.")
        return
    try:
        token = client.authorize_access_token(request)
        claims = provider_claims(client, token)
    except (*TOKEN_ERRORS, SignInRefused) as exc:
        log.warning("A fresh sign-in at the provider did not complete: %s", exc)
        return
    auth_time = claims.get("auth_time")
    if (_same_person(request, claims) and isinstance(auth_time, (int, float))
            and not isinstance(auth_time, bool)):
        request.session[FRESH_SIGN_IN] = {"user": request.user.pk, "purpose": trip["purpose"],
                                          "auth_time": float(auth_time)}


def _refused(request, problem: str, status: int = 400):
    form = auth_views.AuthenticationForm(request)
    return render(request, "registration/login.html", {
        "form": form, "sso": True, "sso_label": settings.TOLLGATE_OIDC_LABEL,
        "sso_only": settings.TOLLGATE_OIDC_ONLY, "sso_problem": problem}, status=status)


def provider_claims(client, token: dict) -> dict:
    """The person the provider vouches for: the ID token's checked claims, completed from
    userinfo when the ID token lacks the groups claim. Userinfo must name the ID token's
    subject (OpenID Connect Core 5.3.2), or nothing of it is believed."""
    claims = dict(token.get("userinfo") or {})
    if not claims.get("sub"):
        raise SignInRefused("The provider sent no ID token, so nobody can be signed in.")
    if settings.TOLLGATE_OIDC_GROUPS_CLAIM not in claims:
        extra = dict(client.userinfo(token=token))
        if str(extra.get("sub") or "") != str(claims["sub"]):
            raise SignInRefused("The provider's userinfo names another person than its ID "
                                "token; nobody was signed in.")
        claims = {**extra, **claims}
    return claims


def _recheck_ended(request, problem: str):
    """A session's check at the provider failed: the session ends here too."""
    log.info("Sign-on check ended the session of %s: %s", request.user, problem)
    auth.logout(request)
    return _refused(request, "Your company sign-in has ended or changed, so your Tollgate "
                             "session ended too: sign in again.", status=403)


@login_not_required
@require_GET
def callback(request):
    """The provider sends the person back here with a code: exchanged for tokens, the ID
    token checked, the account made or updated, and the person signed in. Every answer that
    does not verify is a sign-in error on the sign-in page, never a server error."""
    if not provider.enabled():
        raise Http404("Single sign-on is not set up.")
    client = provider.client()
    trips = dict(request.session.get(SIGNING) or {})
    trip = trips.pop(request.GET.get("state", ""), None)
    if trip is not None and request.user.is_authenticated:
        request.session[SIGNING] = trips
        _fresh(request, client, trip)  # the page it goes back to says what came of it
        response = redirect(_safe_next(request, trip["next"]))
        response.delete_cookie(BROWSER, path=reverse("sso_callback"))
        return response
    recheck = request.session.pop(RECHECK, False) and request.user.is_authenticated
    try:
        token = client.authorize_access_token(request)
        claims = provider_claims(client, token)
        if recheck and not _same_person(request, claims):
            return _recheck_ended(request, "another person came back from the provider")
        user = sign_in_user(claims, settings.TOLLGATE_OIDC_ISSUER)
    except TOKEN_ERRORS as exc:
        if recheck:
            return _recheck_ended(request, str(exc))
        log.warning("Sign-on refused: %s", exc)
        described = getattr(exc, "description", None) or str(exc) or type(exc).__name__
        return _refused(request, f"The sign-in did not complete: {described}. Try again.")
    except SignInRefused as exc:
        if recheck:
            return _recheck_ended(request, str(exc))
        return _refused(request, str(exc), status=403)
    target = _safe_next(request, request.session.pop(NEXT, ""))
    if not recheck:
        auth.login(request, user, backend="workflows.sso.backends.PasswordBackend")
    request.session[ID_TOKEN] = token.get("id_token", "")
    request.session[CHECKED_AT] = int(time.time())
    return redirect(target)


def _same_person(request, claims: dict) -> bool:
    from workflows.models import SsoIdentity

    return SsoIdentity.objects.filter(
        issuer=settings.TOLLGATE_OIDC_ISSUER, subject=str(claims.get("sub") or ""),
        user=request.user).exists()


@require_POST
def sign_out(request):
    """Sign out here, and at the provider too when it offers an end-session endpoint."""
    id_token = request.session.get(ID_TOKEN)
    auth.logout(request)
    label = settings.TOLLGATE_OIDC_LABEL
    if id_token and provider.enabled():
        try:
            metadata = provider.client().load_server_metadata()
        except TOKEN_ERRORS:  # the provider away: signed out here all the same
            log.warning("Could not reach the provider to end its session too", exc_info=True)
            metadata = {}
        if metadata.get("end_session_endpoint"):
            messages.info(request, f"You are signed out of Tollgate and of {label}.")
            return provider.client().logout_redirect(
                request, post_logout_redirect_uri=_absolute(request, "login"),
                id_token_hint=id_token)
        messages.info(request, f"You are signed out of Tollgate. {label} does not end its "
                               "own session from here: sign out there too on a shared "
                               "computer.")
        return redirect("login")
    messages.info(request, "You are signed out.")
    return redirect("login")

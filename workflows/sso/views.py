"""Sign-in through the provider, its callback, and sign-out that ends the provider's session
where it offers one."""

from __future__ import annotations

import logging

from authlib.integrations.base_client import OAuthError
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from . import provider
from .accounts import SignInRefused, password_allowed, sign_in_user

log = logging.getLogger(__name__)

NEXT = "tollgate_sso_next"
ID_TOKEN = "tollgate_sso_id_token"


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
    return provider.client().authorize_redirect(request, _absolute(request, "sso_callback"))


def _refused(request, problem: str, status: int = 400):
    form = auth_views.AuthenticationForm(request)
    return render(request, "registration/login.html", {
        "form": form, "sso": True, "sso_label": settings.TOLLGATE_OIDC_LABEL,
        "sso_only": settings.TOLLGATE_OIDC_ONLY, "sso_problem": problem}, status=status)


@login_not_required
@require_GET
def callback(request):
    """The provider sends the person back here with a code: exchanged for tokens, the ID
    token checked, the account made or updated, and the person signed in."""
    if not provider.enabled():
        raise Http404("Single sign-on is not set up.")
    client = provider.client()
    try:
        token = client.authorize_access_token(request)
        claims = dict(token.get("userinfo") or {})
        if settings.TOLLGATE_OIDC_GROUPS_CLAIM not in claims:
            claims.update(client.userinfo(token=token))
        user = sign_in_user(claims, settings.TOLLGATE_OIDC_ISSUER)
    except OAuthError as exc:
        log.warning("Sign-on refused: %s", exc)
        return _refused(request, f"The sign-in did not complete: {exc.description or exc}. "
                                 "Try again.")
    except SignInRefused as exc:
        return _refused(request, str(exc), status=403)
    target = _safe_next(request, request.session.pop(NEXT, ""))
    auth.login(request, user, backend="workflows.sso.backends.PasswordBackend")
    request.session[ID_TOKEN] = token.get("id_token", "")
    return redirect(target)


@require_POST
def sign_out(request):
    """Sign out here, and at the provider too when it offers an end-session endpoint."""
    id_token = request.session.get(ID_TOKEN)
    auth.logout(request)
    if id_token and provider.enabled():
        metadata = provider.client().load_server_metadata()
        if metadata.get("end_session_endpoint"):
            return provider.client().logout_redirect(
                request, post_logout_redirect_uri=_absolute(request, "login"),
                id_token_hint=id_token)
    return redirect("login")

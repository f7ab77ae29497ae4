from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode

from workflows.people.sessions import SIGNED_IN_AT


def note_sign_in(sender, request, user, **kwargs):
    """Stamp the session with its sign-in time (connected in the app's ready())."""
    if request is not None and hasattr(request, "session"):
        request.session[SIGNED_IN_AT] = int(time.time())


class SessionAge:
    """A session signed in longer ago than TOLLGATE_SESSION_MAX_AGE signs in again (so a
    person removed from a group at the provider loses it within that time). API tokens are
    not sessions and are not affected."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.TOLLGATE_SESSION_MAX_AGE
        user = getattr(request, "user", None)
        if limit and user is not None and user.is_authenticated and hasattr(request, "session") \
                and "_auth_user_id" in request.session:
            signed_in = request.session.get(SIGNED_IN_AT, 0)
            if time.time() - signed_in > limit:
                logout(request)
                return _go_through(request, "login", {}, "Your session expired: sign in again.")
        return self.get_response(request)


class SsoRecheck:
    """A session that signed in through the provider is checked there again once it is
    TOLLGATE_OIDC_RECHECK_SECONDS old: a silent round trip (prompt=none) that brings back
    the person's groups as the provider has them now, or ends the session when the provider
    no longer vouches for them (disabled, removed, signed out there). Until the check is
    made, the session's requests go through it, so a person removed from a group at the
    provider decides none of its gates after the next check."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from .views import CHECKED_AT, ID_TOKEN

        every = settings.TOLLGATE_OIDC_RECHECK_SECONDS
        session = getattr(request, "session", None)
        if (every and settings.TOLLGATE_OIDC_ISSUER and session is not None
                and session.get(ID_TOKEN) is not None and request.user.is_authenticated
                and time.time() - session.get(CHECKED_AT, 0) > every
                and not request.path.startswith(("/sso/", "/static/", reverse("logout")))):
            return _go_through(request, "sso_login", {"recheck": "1"},
                               "Your company sign-in needs checking: reload the page.")
        return self.get_response(request)


def _go_through(request, view: str, query: dict, api_message: str):
    """Send the browser to `view` and back: a page by redirect, an htmx request by
    HX-Redirect (back to the page it came from), the API with 401 and why."""
    if request.path.startswith("/api/"):
        return HttpResponse(json.dumps({"error": api_message}),
                            content_type="application/json", status=401)
    back = request.get_full_path() if request.method == "GET" else ""
    if request.headers.get("HX-Request"):
        current = urlsplit(request.headers.get("HX-Current-URL", ""))
        back = current.path + (f"?{current.query}" if current.query else "")
    target = f"{reverse(view)}?{urlencode({**query, 'next': back})}"
    if request.headers.get("HX-Request"):
        response = HttpResponse(status=401)
        response["HX-Redirect"] = target
        return response
    return redirect(target)

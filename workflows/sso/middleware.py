from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode

SIGNED_IN_AT = "tollgate_signed_in_at"


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
                login = f"{reverse('login')}?{urlencode({'next': request.get_full_path()})}"
                if request.headers.get("HX-Request"):
                    response = HttpResponse(status=401)
                    response["HX-Redirect"] = login
                    return response
                if request.path.startswith("/api/"):
                    return HttpResponse('{"error": "Your session expired: sign in again."}',
                                        content_type="application/json", status=401)
                return redirect(login)
        return self.get_response(request)

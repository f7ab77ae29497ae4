"""Tollgate as an installable web app: its manifest and its service worker (at /sw.js, so
that it controls the whole site), and the push subscriptions people make on their profile."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_POST

from workflows.delivery import push
from workflows.models import PushSubscription


@login_not_required
@require_GET
def manifest(request):
    return JsonResponse({
        "name": "Tollgate", "short_name": "Tollgate", "start_url": "/", "scope": "/",
        "display": "standalone", "background_color": "#ffffff", "theme_color": "#1d2330",
        "description": "Approve and follow workflow runs.",
        "icons": [{"src": static("tollgate/icon-192.png"), "sizes": "192x192",
                   "type": "image/png", "purpose": "any"},
                  {"src": static("tollgate/icon-512.png"), "sizes": "512x512",
                   "type": "image/png", "purpose": "any"}]},
        content_type="application/manifest+json")


@login_not_required
@require_GET
def service_worker(request):
    script = render_to_string("workflows/app/sw.js",
                              {"icon": static("tollgate/icon-192.png")})
    response = HttpResponse(script, content_type="text/javascript")
    response["Service-Worker-Allowed"] = "/"
    response["Cache-Control"] = "no-cache"  # a new release's worker is found at once
    return response


@require_POST
def push_subscribe(request):
    """POST /push/subscriptions/ with a browser's PushSubscription as JSON."""
    if not push.enabled():
        return JsonResponse({"detail": "Push notifications are not set up on this Tollgate "
                                       "(TOLLGATE_VAPID_KEY_FILE)."}, status=404)
    try:
        info = json.loads(request.body or b"null")
        row = push.subscribe(request.user, info, request.headers.get("User-Agent", ""))
    except (ValueError, push.BadSubscription) as exc:
        return JsonResponse({"detail": f"Not a push subscription: {exc}; nothing was kept."},
                            status=400)
    return JsonResponse({"id": row.pk, "device": row.device}, status=201)


@require_POST
def push_unsubscribe(request, pk: int):
    """Stop pushing to one of your browsers."""
    removed, _ = PushSubscription.objects.filter(pk=pk, user=request.user).delete()
    if removed:
        messages.success(request, "That browser gets no more notifications.")
    return redirect("/profile/#push")

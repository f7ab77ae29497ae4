"""Chat's ways in: the platform's interaction requests (answered within its time limit, the
decision made after by a worker), and the page where a person links their chat account."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from workflows.chat import identities, interactions, providers
from workflows.chat.base import Refused
from workflows.delivery import dispatch


# The platforms sign their requests (Slack a signature, the Bot Framework a bearer token):
# there is no session or form to forge.
@csrf_exempt
@login_not_required
@require_POST
def platform_requests(request, platform: str):
    """A chat platform's requests (Slack's interactions, the Teams app's messaging
    endpoint: presses and refreshes), answered within its time limit; a press is decided
    after, by a worker."""
    chat = providers.get(platform)
    if chat is None:
        raise Http404(f"{platform.capitalize()} is not set up.")
    try:
        answer, press_id = interactions.receive(chat, request.headers, request.body)
    except Refused as exc:
        return JsonResponse({"error": str(exc)}, status=401)
    if press_id is not None:
        dispatch.handle_chat_press(press_id)
    return JsonResponse(answer) if answer else HttpResponse(status=200)


@require_http_methods(["GET", "POST"])
def chat_link(request, token: str):
    """Confirm, signed in, that a chat account is yours: from then on its presses act as
    you, under your permissions."""
    try:
        link = identities.read_link(token)
    except identities.BadLink as exc:
        return render(request, "workflows/chat_link.html", {"problem": str(exc)}, status=400)
    existing = identities.find(link.provider, link.team, link.chat_user)
    if request.method == "POST":
        try:
            existing = identities.confirm(link, request.user)
        except identities.BadLink as exc:
            return render(request, "workflows/chat_link.html",
                          {"link": link, "problem": str(exc)},
                          status=409 if identities.find(link.provider, link.team,
                                                        link.chat_user) else 403)
        return render(request, "workflows/chat_link.html", {"link": link, "linked": existing})
    if existing is not None and existing.user_id != request.user.pk:
        return render(request, "workflows/chat_link.html", {"link": link, "problem": (
            "That chat account already acts as another Tollgate user.")}, status=409)
    if existing is None and (problem := identities.refusal(link, request.user)):
        return render(request, "workflows/chat_link.html", {"link": link, "problem": problem},
                      status=403)
    return render(request, "workflows/chat_link.html", {"link": link, "linked": existing})

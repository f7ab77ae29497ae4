"""Your account: API tokens (made, shown once, revoked), passkeys (added, removed), your time
zone, and who decides your gates while you are away."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from workflows import engine
from workflows.delivery import push
from workflows.models import ApiToken, Preference
from workflows.people.permissions import acting_for
from workflows.timing import clock, timezones
from workflows.web import passkeys
from workflows.web.forms import AwayForm


@never_cache  # the page shows a new token once: no cache may keep it
@require_http_methods(["GET", "POST"])
def profile(request):
    """Your API tokens (create one, shown once, or revoke one), your time zone, your daily
    digest and your away period."""
    new_token = away = None
    preference = Preference.objects.filter(user=request.user).first() or Preference(
        user=request.user)
    if request.method == "POST" and "time_zone" in request.POST:
        preference.time_zone = request.POST["time_zone"].strip()[:64]
        try:
            preference.full_clean()
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
        else:
            preference.save()
            timezones.remember(request, preference.time_zone)
            messages.success(request, f"Times now show in {preference.time_zone or 'the '
                                                          'site time zone'}.")
            return redirect("profile")
    elif request.method == "POST" and "digest_hour" in request.POST:
        hour = request.POST["digest_hour"].strip()
        if hour and not (hour.isdigit() and 0 <= int(hour) <= 23):
            messages.error(request, f"The digest's hour must be a whole hour from 0 to 23, not "
                                    f"{hour[:20]!r}: nothing was changed.")
            return redirect("profile")
        preference.digest_hour = int(hour) if hour else None
        if _saved(request, preference):
            messages.success(request, f"A digest of the gates waiting on you comes each day "
                                      f"at {preference.digest_hour:02d}:00 your time."
                             if hour else "No more digests.")
        return redirect("profile")
    elif request.method == "POST" and "away" in request.POST:
        away = AwayForm(request.POST)
        if away.is_valid():
            preference.away_from = away.cleaned_data["away_from"]
            preference.away_until = away.cleaned_data["away_until"]
            preference.delegate = away.cleaned_data["delegate"]
            if _saved(request, preference):
                messages.success(request, f"While you are away, {preference.delegate} decides "
                                          "your gates.")
                return redirect("profile")
    elif request.method == "POST" and "back" in request.POST:
        preference.away_from = preference.away_until = preference.delegate = None
        if _saved(request, preference):
            messages.success(request, "You decide your own gates again.")
        return redirect("profile")
    elif request.method == "POST":
        name = request.POST.get("name", "").replace("\x00", "").strip()[:100]
        if not name:  # a token is found again, and revoked, by its name
            messages.error(request, "Name the token (what uses it, such as “release bot”): "
                                    "no token was made.")
        else:
            _, new_token = ApiToken.objects.issue(request.user, name, actor=request.user)
    tokens = ApiToken.objects.filter(user=request.user)
    if away is None:
        away = AwayForm(initial={"away_from": preference.away_from,
                                 "away_until": preference.away_until,
                                 "delegate": preference.delegate.get_username()
                                 if preference.delegate else ""})
    return render(request, "workflows/profile.html", {
        "tokens": tokens, "new_token": new_token, "passkeys": request.user.passkeys.all(),
        "passkeys_possible": passkeys.possible(request), "preference": preference, "away": away,
        "away_now": preference.delegating_at(clock.now()),
        "deciding_for": acting_for(request.user),
        "zones": timezones.choices(), "site_zone": settings.TIME_ZONE,
        "hours": range(24),
        "push_key": push.public_key() if push.enabled() else "",
        "push_devices": request.user.push_subscriptions.all()})


def _saved(request, preference) -> bool:
    """Check and save a person's preference; a refusal is shown, nothing is saved."""
    try:
        preference.full_clean()
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return False
    preference.save()
    return True


@require_POST
def token_revoke(request, pk: int):


    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        messages.success(request, f"Token {token} revoked.")
    return redirect("profile")


@require_POST
def passkey_options(request):
    """WebAuthn creation options for a new passkey of this person (JSON), or 403 saying
    why not."""
    try:
        options = passkeys.registration_options(request)
    except engine.WorkflowError as exc:
        return JsonResponse({"error": str(exc)}, status=403)
    return HttpResponse(options, content_type="application/json")


@require_POST
def passkey_add(request):
    """Keep the passkey the browser made, if it answers this session's challenge."""
    try:
        passkey = passkeys.register(request, request.POST.get("name", ""),
                                    request.POST.get("credential", ""))
    except engine.WorkflowError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Passkey “{passkey.name}” added: it can sign your "
                                  "decisions.")
    return redirect("profile")


@require_POST
def passkey_remove(request, pk: int):
    try:
        passkey = passkeys.remove(request, pk)
    except engine.NotFound:
        raise Http404("No such passkey of yours.") from None
    except engine.WorkflowError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Passkey “{passkey.name}” removed.")
    return redirect("profile")

"""Your account: API tokens (made, shown once, revoked) and your time zone."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from workflows import timezones
from workflows.models import ApiToken, Preference


@never_cache  # the page shows a new token once: no cache may keep it
@require_http_methods(["GET", "POST"])
def profile(request):
    """Your API tokens (create one, shown once, or revoke one) and your time zone."""
    new_token = None
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
    elif request.method == "POST":
        name = request.POST.get("name", "").replace("\x00", "").strip()[:100] or "API token"
        _, new_token = ApiToken.objects.issue(request.user, name, actor=request.user)
    tokens = ApiToken.objects.filter(user=request.user)
    return render(request, "workflows/profile.html", {
        "tokens": tokens, "new_token": new_token, "preference": preference,
        "zones": timezones.choices(), "site_zone": settings.TIME_ZONE})


@require_POST
def token_revoke(request, pk: int):


    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        messages.success(request, f"Token {token} revoked.")
    return redirect("profile")

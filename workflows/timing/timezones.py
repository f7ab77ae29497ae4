"""Each person's pages in their own time zone: the preference is copied into the session at
sign-in and when changed, and the middleware activates it per request (no query of its own)."""

from __future__ import annotations

import zoneinfo
from datetime import date, datetime, time
from functools import cache

from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.utils import timezone

from workflows.models import Preference

SESSION_KEY = "tollgate_tz"


def day_starts(day: date) -> datetime:
    """The instant a calendar day starts in the current time zone (the viewer's, per
    request): day and week filters compare instants, which an index can range over."""
    return timezone.make_aware(datetime.combine(day, time.min))


@cache
def choices() -> list[str]:
    return sorted(zoneinfo.available_timezones())


def remember(request, name: str) -> None:
    """Use this time zone for the signed-in person's pages from now on ("" for the site's)."""
    if name:
        request.session[SESSION_KEY] = name
    else:
        request.session.pop(SESSION_KEY, None)


@receiver(user_logged_in)
def on_sign_in(sender, request, user, **kwargs):
    if request is not None and hasattr(request, "session"):
        remember(request, Preference.objects.filter(user=user)
                 .values_list("time_zone", flat=True).first() or "")


def zone_of(user) -> zoneinfo.ZoneInfo:
    """The time zone a person reads times in (their preference, else the site's): for what is
    sent to them (mail, chat), where no request carries it."""
    return zone_named(Preference.objects.filter(user=user).values_list(
        "time_zone", flat=True).first())


def zone_named(name: str | None) -> zoneinfo.ZoneInfo:
    """The zone of this name (a preference's), else the site's."""
    try:
        return zoneinfo.ZoneInfo(name) if name else timezone.get_default_timezone()
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return timezone.get_default_timezone()

"""The pages' own middleware: the viewer's time zone for the request."""

from __future__ import annotations

import zoneinfo

from django.utils import timezone

from workflows.timing.timezones import SESSION_KEY


class ViewerTimeZone:
    """Activate the viewer's time zone for the request (Django's own timezone machinery):
    the zone they chose, kept in their session at sign-in (`timezones.remember`)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
        try:
            timezone.activate(zoneinfo.ZoneInfo(name)) if name else timezone.deactivate()
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            timezone.deactivate()
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()

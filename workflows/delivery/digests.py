"""The daily digest: for each person who asked for one (Preference.digest_hour), one mail at
that hour of their own time zone listing every gate that waits on them, each with its
essentials and its own link, and one link that opens the inbox with the plain ones ticked
(those a press can decide: no signature, no form), to approve them with one more press.

A person's digest is claimed for their day and recorded for sending in one transaction, so
two consumers never both send it, and a consumer that dies before sending loses nothing (the
mail waits for `send_due`). A day with nothing waiting sends nothing."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from workflows.models import Notification, Preference
from workflows.people.permissions import decidable_by
from workflows.reads import briefs
from workflows.timing import clock
from workflows.timing.timezones import zone_named

from . import links, notifications

log = logging.getLogger(__name__)

LIMIT = 100  # gates listed in one digest, the longest waiting first


def _due(preference: Preference, now: datetime):
    """The person's local date when their digest is due now (their hour has come today and
    today's is not sent), else None."""
    local = timezone.localtime(now, zone_named(preference.time_zone))
    if local.hour < preference.digest_hour or preference.digest_sent_on == local.date():
        return None
    return local.date()


def gates_for(user) -> list:
    """The gates waiting on this person, with what a digest shows of each."""
    gates = briefs.gate_evidence(list(
        decidable_by(user).select_related("run", "run__spec", "run__requested_by")
        .order_by("waiting_since", "pk")[:LIMIT]))
    for gate in gates:
        gate.page_only = briefs.page_only(gate)
        gate.decide_link = links.decision_url(user, gate)
    return gates


def send_digests(now: datetime | None = None) -> int:
    """Record and send every digest due now; how many went."""
    now = now or clock.now()
    sent = 0
    for preference in (Preference.objects.filter(digest_hour__isnull=False,
                                                 user__is_active=True)
                       .exclude(user__email="").select_related("user")):
        day = _due(preference, now)
        if day is None:
            continue
        note = _record(preference, day, now)
        if note is not None:
            sent += notifications.send(note.pk, now)
    return sent


def _record(preference: Preference, day, now) -> Notification | None:
    """Claim the person's digest for `day` and record its mail, in one transaction (None when
    another consumer claimed it, or nothing waits)."""
    user = preference.user
    with transaction.atomic():
        claimed = Preference.objects.filter(pk=preference.pk).exclude(
            digest_sent_on=day).update(digest_sent_on=day)
        if not claimed:
            return None
        gates = gates_for(user)
        if not gates:
            return None
        plain = [gate for gate in gates if not gate.page_only]
        context = {"user": user, "gates": gates, "plain": plain, "day": day,
                   "together_link": links.digest_url(user, plain) if len(plain) > 1 else "",
                   "hour": preference.digest_hour,
                   "profile_link": links.absolute(reverse("profile"))}
        text, html = notifications.render("digest", context, zone_named(preference.time_zone))
        count = f"{len(gates)} gate{'s' if len(gates) != 1 else ''}"
        return Notification.objects.create(
            user=user, key=f"digest:{day.isoformat()}", event="digest", subject=(
                f"[Tollgate] {count} wait{'s' if len(gates) == 1 else ''} on you "
                f"({day:%a %d %b})"), body=text, html=html, next_attempt_at=now)

"""Push to people's browsers and phones (Web Push, RFC 8030, with VAPID, RFC 8292; payloads
encrypted to each browser's keys, RFC 8291, by pywebpush).

A gate that starts waiting on a person, a reminder and an escalation are pushed to every
browser they turned notifications on in. The notification opens the gate's decision page
(its signed link); its Approve and Reject open that page with the choice made, where one
press decides: a push decides nothing by itself. Push is a courtesy beside the mail, which
is the record of who was told: a push that fails is logged, not retried; a subscription the
push service says is gone (404, 410) is dropped. Endpoints follow the webhooks' address
rules (https, public addresses), checked when subscribed and again before each push."""

from __future__ import annotations

import base64
import http.client
import json
import logging
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from py_vapid import Vapid
from pywebpush import WebPushException, webpush

from tollgate.secret_files import made_once
from workflows.models import Checkpoint, PushSubscription
from workflows.people.permissions import deciders
from workflows.reads import briefs
from workflows.timing import clock
from workflows.timing.timezones import zone_of

from . import links
from .addresses import PinnedSession, RefusedAddress, check_url

log = logging.getLogger(__name__)

EVENTS = {"gate_waiting": "waits on you", "gate_reminded": "still waits on you",
          "gate_escalated": "was escalated to you", "gate_reassigned": "was handed to you"}
TTL_SECONDS = 24 * 3600  # a push service keeps an undelivered message this long
TIMEOUT_SECONDS = 10


class BadSubscription(ValueError):
    """A subscription that cannot be kept; the message says what is wrong with it."""


def enabled() -> bool:
    return bool(settings.TOLLGATE_VAPID_KEY_FILE)


def _vapid() -> Vapid:
    """The deployment's VAPID key, made at first use when its file is missing (mode 0600;
    processes racing to make it agree on the first one written)."""
    return _load(settings.TOLLGATE_VAPID_KEY_FILE)


@cache
def _load(name: str) -> Vapid:
    return Vapid.from_pem(made_once(Path(name), lambda: ec.generate_private_key(
        ec.SECP256R1()).private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())))


def public_key() -> str:
    """The key browsers subscribe with (applicationServerKey): the uncompressed point,
    base64url without padding."""
    point = _vapid().public_key.public_bytes(serialization.Encoding.X962,
                                             serialization.PublicFormat.UncompressedPoint)
    return base64.urlsafe_b64encode(point).decode().rstrip("=")


def _key(value, length: int, name: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(str(value) + "=" * (-len(str(value)) % 4))
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != length:
        raise BadSubscription(f"keys.{name} must be {length} bytes, base64url-encoded")
    return str(value)


def subscribe(user, info, device: str = "") -> PushSubscription:
    """Keep a browser's PushSubscription (its JSON: endpoint and keys.p256dh, keys.auth) for
    this person; the same endpoint subscribed again is updated, and moves to this person."""
    if not isinstance(info, dict) or not isinstance(info.get("keys"), dict):
        raise BadSubscription("send the browser's PushSubscription as JSON: "
                              '{"endpoint": ..., "keys": {"p256dh": ..., "auth": ...}}')
    endpoint = str(info.get("endpoint") or "")
    if len(endpoint) > 1000:
        raise BadSubscription("endpoint is longer than 1000 characters")
    try:
        check_url(endpoint)
    except RefusedAddress as exc:
        raise BadSubscription(f"endpoint {exc}") from None
    keys = {"p256dh": _key(info["keys"].get("p256dh", ""), 65, "p256dh"),
            "auth": _key(info["keys"].get("auth", ""), 16, "auth")}
    try:
        with transaction.atomic():
            row, _ = PushSubscription.objects.update_or_create(
                endpoint=endpoint, defaults={"user": user, **keys, "device": device[:200]})
    except IntegrityError:  # the same browser subscribing twice at once: the other won
        row = PushSubscription.objects.get(endpoint=endpoint)
    return row


def send(subscription: PushSubscription, payload: dict) -> bool:
    """Push one message to one browser; True when the push service took it. A browser the
    service says is gone is dropped."""
    try:
        # Its address checked now, not only when subscribed, and connected to as checked.
        webpush({"endpoint": subscription.endpoint,
                 "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth}},
                json.dumps(payload), vapid_private_key=_vapid(),
                vapid_claims={"sub": settings.TOLLGATE_VAPID_SUBJECT
                              or f"mailto:{settings.DEFAULT_FROM_EMAIL}"},
                ttl=TTL_SECONDS, timeout=TIMEOUT_SECONDS, requests_session=PinnedSession())
    except WebPushException as exc:
        status = getattr(exc.response, "status_code", None)
        if status in (404, 410):
            subscription.delete()
            log.info("Push subscription %s is gone (%s): dropped", subscription.pk, status)
        else:
            log.warning("Push to subscription %s failed: %s", subscription.pk, exc)
        return False
    except (RefusedAddress, OSError, http.client.HTTPException) as exc:
        log.warning("Push to subscription %s not sent: %s", subscription.pk, exc)
        return False
    PushSubscription.objects.filter(pk=subscription.pk).update(last_pushed_at=clock.now())
    return True


def messages_for(checkpoint: Checkpoint, event: str, step_key: str):
    """(subscription, payload) for each browser of each person this gate event concerns."""
    if event not in EVENTS or not step_key:
        return
    run = checkpoint.run
    step = run.steps.filter(key=step_key).first()
    if step is None:
        return
    people = list(deciders(run, step))
    subscriptions = list(PushSubscription.objects.filter(user__in=people).select_related(
        "user"))
    if not subscriptions:
        return
    step.run = run
    briefs.gate_evidence([step])
    plain = not briefs.page_only(step)
    payloads: dict[int, dict] = {}  # a person's, whatever number of browsers they have
    for subscription in subscriptions:
        user = subscription.user
        if user.pk not in payloads:
            due = ""
            if step.due:
                at = timezone.localtime(step.due["at"], zone_of(user))
                due = f"; decide by {at:%a %H:%M}, then it {step.due['then']}"
            payloads[user.pk] = {
                "title": f"{step.title} {EVENTS[event]}",
                "body": f"{run}: {step.approved} of {step.approval_required} approvals{due}",
                "url": links.decision_url(user, step),
                # One notification per gate and attempt: a later one replaces it.
                "tag": f"gate-{step.pk}-{step.attempt}",
                # Approve and Reject on the notification (a signed gate, or one with a
                # form, is decided on its page as it is).
                "choices": plain}
        yield subscription, payloads[user.pk]


def deliver(checkpoint_id: int, events) -> int:
    """Push what a checkpoint's events owe; how many pushes the services took."""
    if not enabled():
        return 0
    checkpoint = Checkpoint.objects.select_related("run").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return 0
    return sum(send(subscription, payload) for event, step_key in events
               for subscription, payload in messages_for(checkpoint, event, step_key))

"""Webhooks: a group's gate events posted as signed JSON, a second channel beside mail.

Each event is planned once per webhook (a row, unique per event), then posted with retries
until the receiver answers 2xx or the attempts run out; every attempt is recorded on the
row. A delivery whose doorbell was lost is found again by the periodic task. The body is
signed with the webhook's secret:

    X-Tollgate-Signature: sha256=<hex HMAC-SHA256 of "<X-Tollgate-Timestamp>.<body>">

so a receiver can check that it came from Tollgate, unaltered and recent. A post may come
twice (a worker dying after the receiver answered): X-Tollgate-Delivery names it.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q

from workflows.delivery import addresses, links
from workflows.delivery.addresses import RefusedAddress
from workflows.models import (
    Checkpoint,
    DeliveryStatus,
    GateRule,
    Step,
    StepStatus,
    Webhook,
    WebhookDelivery,
)
from workflows.timing import clock

log = logging.getLogger(__name__)

GATE_EVENTS = ("gate_waiting", "gate_decided", "gate_escalated", "gate_reassigned")
# Seconds before each retry; after the last, the delivery is marked failed.
RETRY_DELAYS = (10, 60, 300, 1800)
TIMEOUT_SECONDS = 10
# A claimed attempt is this long away from being claimed again (a worker died mid-post).
CLAIM_SECONDS = 60


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def plan(checkpoint_id: int, events) -> list[int]:
    """Delivery rows for a checkpoint's gate events, one per event and active webhook of
    a group the gate's rules name; planning again (a retried task) adds none. Returns new
    row ids."""
    checkpoint = (Checkpoint.objects.select_related("run", "run__requested_by", "actor")
                  .filter(pk=checkpoint_id).first())
    if checkpoint is None:
        return []
    planned = []
    for event, step_key in events:
        if event not in GATE_EVENTS:
            continue
        step = Step.objects.filter(run_id=checkpoint.run_id, key=step_key).first()
        if step is None:
            continue
        # Every group the gate's rules name is told (a webhook a group's own).
        groups = {step.approval_group, *GateRule.objects.filter(
            step=step, attempt=step.attempt).exclude(group="").values_list("group", flat=True)}
        for webhook in Webhook.objects.filter(active=True, group__in=groups):
            key = f"{checkpoint.run_id}:{checkpoint.seq}:{event}:{step_key}"
            try:
                with transaction.atomic():
                    delivery = WebhookDelivery.objects.create(
                        webhook=webhook, key=key, event=event, run=checkpoint.run,
                        payload=payload(event, checkpoint, step), rung_at=clock.now())
            except IntegrityError:
                continue  # planned by an earlier try of this task
            planned.append(delivery.pk)
    return planned


def payload(event: str, checkpoint: Checkpoint, step: Step) -> dict:
    run = checkpoint.run
    body = {
        "event": event,
        "at": checkpoint.at.isoformat(),
        "run": {"id": run.pk, "title": run.title, "spec": run.spec_name,
                "status": checkpoint.run_status, "url": links.absolute(run.get_absolute_url()),
                "requested_by": run.requested_by.get_username() if run.requested_by else None},
        "gate": {"key": step.key, "title": step.title, "group": step.approval_group,
                 "attempt": step.attempt, "status": gate_status(event, checkpoint, step),
                 "deadline": step.deadline_at.isoformat() if step.deadline_at else None},
        "summary": checkpoint.summary,
    }
    if event == "gate_reassigned":
        body["reassigned"] = {key: checkpoint.evidence.get(key)
                              for key in ("rule", "from", "to", "reason")}
    if event == "gate_decided":
        outcome = {StepStatus.COMPLETED: "approved", StepStatus.FAILED: "rejected"}
        body["decision"] = {"outcome": outcome.get(checkpoint.step_status, "timed out"),
                            "by": checkpoint.actor_name, "comment": checkpoint.summary,
                            "values": checkpoint.evidence.get("values", {})}
    return body


def gate_status(event: str, checkpoint: Checkpoint, step: Step) -> str:
    """The gate's own status at the event (a gate opens on its dependency's checkpoint)."""
    if checkpoint.step_id == step.pk and checkpoint.step_status:
        return checkpoint.step_status
    return StepStatus.WAITING_APPROVAL if event != "gate_decided" else step.status


def post(url: str, body: bytes, headers: dict) -> int:
    """POST to a checked address (no redirects followed); the answer's status code.
    RefusedAddress for a URL that may not be reached; OSError when nothing answered."""
    return addresses.post(url, body, headers, TIMEOUT_SECONDS).status_code


def deliver(delivery_id: int, now=None) -> str:
    """Post one delivery if it is due (claiming it first, so two workers never post it at
    once); record the attempt. Returns its status afterwards."""
    now = now or clock.now()
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if not claimed or delivery is None:
        return delivery.status if delivery else "missing"
    body = json.dumps({**delivery.payload, "delivery": delivery.pk},
                      sort_keys=True).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json", "User-Agent": "Tollgate-Webhook",
        "X-Tollgate-Event": delivery.event, "X-Tollgate-Delivery": str(delivery.pk),
        "X-Tollgate-Timestamp": timestamp,
        "X-Tollgate-Signature": sign(delivery.webhook.secret, timestamp, body)}
    # Only the status code is recorded: a transport error's text would tell whoever reads
    # the deliveries what answers at an address (a port scanner's oracle).
    code, error = None, ""
    try:
        code = post(delivery.webhook.url, body, headers)
        if not 200 <= code < 300:
            error = f"HTTP {code}"
    except RefusedAddress:
        error = "refused: the URL or its address is not allowed"
    except (OSError, http.client.HTTPException, ValueError):
        error = "no HTTP answer"
    attempts = delivery.attempts + 1
    done = code is not None and 200 <= code < 300
    if done:
        status, next_at = DeliveryStatus.DELIVERED, now
    elif attempts > len(RETRY_DELAYS):
        status, next_at = DeliveryStatus.FAILED, now
    else:
        status = DeliveryStatus.PENDING
        next_at = clock.now() + timedelta(seconds=RETRY_DELAYS[attempts - 1])
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status, attempts=attempts, last_status_code=code, last_error=error[:2000],
        next_attempt_at=next_at, delivered_at=clock.now() if done else None)
    if not done:
        log.warning("Webhook delivery %s to webhook %s: %s (attempt %s)", delivery.pk,
                    delivery.webhook_id, error, attempts)
    return status


def due(now=None, limit: int = 500) -> list[int]:
    """Pending deliveries whose next attempt is due (a lost doorbell, or a retry)."""
    now = now or clock.now()
    return list(WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING,
                                               next_attempt_at__lte=now)
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])


def due_to_ring(now=None, limit: int = 500) -> list[int]:
    """Due deliveries not rung since they came due, each marked rung by whoever takes it:
    consumers ticking at once ring each one once, and a receiver that is down gets one
    attempt per retry, not one per consumer per tick."""
    now = now or clock.now()
    taken = []
    for pk in due(now, limit):
        quiet = now - timedelta(seconds=2 * settings.TOLLGATE_SWEEP_SECONDS)
        fresh = (Q(rung_at__isnull=True) | Q(rung_at__lt=F("next_attempt_at"))
                 | Q(rung_at__lt=quiet))
        if WebhookDelivery.objects.filter(fresh, pk=pk).update(rung_at=now):
            taken.append(pk)
    return taken

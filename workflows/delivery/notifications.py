"""Email notifications: one message per event per person, however often a task is retried."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from workflows.delivery import links
from workflows.models import Checkpoint, Notification, StepStatus
from workflows.permissions import deciders

log = logging.getLogger(__name__)


def messages_for(checkpoint: Checkpoint, event: str, step_key: str):
    """(user, subject, body) for each person this event concerns."""
    run = checkpoint.run
    step = run.steps.filter(key=step_key).first() if step_key else None
    requester = run.requested_by if run.requested_by and run.requested_by.email else None
    link = links.absolute(run.get_absolute_url())
    if event in ("gate_waiting", "gate_escalated") and step is not None:
        members = deciders(run, step).exclude(email="")
        verb = "was escalated to" if event == "gate_escalated" else "waits on"
        for user in members:
            # A link signed for this person, this gate and this attempt (see links.py).
            yield user, f"[Tollgate] {step.title} {verb} {step.approval_group}: {run}", (
                f"{step.title} of run {run} {verb} the {step.approval_group} group.\n"
                f"Decide it, with its evidence, at:\n{links.decision_url(user, step)}\n\n"
                f"The run:\n{link}\n")
        if event == "gate_escalated" and requester:
            yield requester, f"[Tollgate] {step.title} escalated: {run}", (
                f"No decision came in time; {step.title} now waits on {step.approval_group}.\n"
                f"{link}\n")
    elif event == "gate_decided" and step is not None and requester:
        outcomes = {StepStatus.COMPLETED: "approved", StepStatus.FAILED: "rejected"}
        outcome = outcomes.get(checkpoint.step_status, checkpoint.step_status)
        yield requester, f"[Tollgate] {step.title} {outcome}: {run}", (
            f"{step.title} of your run {run} was {outcome} by {checkpoint.actor_name}.\n"
            f"{checkpoint.summary}\n{link}\n")
    elif event == "run_failed" and requester:
        yield requester, f"[Tollgate] Run failed: {run}", (
            f"Your run {run} failed: {run.error or checkpoint.summary}\n{link}\n")


# Seconds before each retry of a mail the server did not take; then it is given up.
RETRY_DELAYS = (10, 60, 300, 1800, 3600, 3 * 3600)
CLAIM_SECONDS = 120  # a mail being sent is this long away from being claimed again


def deliver(checkpoint_id: int, events) -> int:
    """Record the messages for a checkpoint's events (one row per person and event, however
    often this runs) and send each; returns how many were sent now. A mail the server does
    not take stays pending and is sent again (`send_due`) until it goes or its retries run
    out, so a mail server that is down loses nothing."""
    checkpoint = Checkpoint.objects.select_related("run", "run__requested_by").filter(
        pk=checkpoint_id).first()
    if checkpoint is None:
        return 0
    sent = 0
    for event, step_key in events:
        for user, subject, body in messages_for(checkpoint, event, step_key):
            key = f"{checkpoint.run_id}:{checkpoint.seq}:{event}:{step_key}"
            try:
                with transaction.atomic():
                    note = Notification.objects.create(
                        user=user, key=key, event=event, run=checkpoint.run, subject=subject,
                        body=body, next_attempt_at=timezone.now())
            except IntegrityError:
                continue  # recorded by an earlier try of this task: send_due has it
            sent += send(note.pk)
    return sent


def send(notification_id: int, now=None) -> bool:
    """Send one pending mail if it is due, claiming it first (two workers never send it at
    once); record the attempt. True when the server took it."""
    now = now or timezone.now()
    claimed = Notification.objects.filter(
        pk=notification_id, sent_at__isnull=True, next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    note = Notification.objects.select_related("user").filter(pk=notification_id).first()
    if not claimed or note is None:
        return False
    try:
        send_mail(note.subject, note.body, None, [note.user.email])
    except Exception as exc:
        attempts = note.attempts + 1
        retry = (timezone.now() + timedelta(seconds=RETRY_DELAYS[attempts - 1])
                 if attempts <= len(RETRY_DELAYS) else None)
        log.warning("Mail %s to %s failed (attempt %s): %s; %s", note.key, note.user,
                    attempts, exc, f"again at {retry:%H:%M:%S}" if retry else "given up")
        Notification.objects.filter(pk=note.pk).update(
            attempts=attempts, next_attempt_at=retry, error=f"{type(exc).__name__}: {exc}"[:2000])
        return False
    Notification.objects.filter(pk=note.pk).update(
        sent_at=timezone.now(), attempts=note.attempts + 1, next_attempt_at=None, error="")
    return True


def send_due(now=None, limit: int = 100) -> int:
    """Send the pending mails whose next attempt is due; returns how many went."""
    now = now or timezone.now()
    due = list(Notification.objects.filter(sent_at__isnull=True, next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    return sum(send(pk, now) for pk in due)

"""Email notifications: one message per event per person, however often a task is retried."""

from __future__ import annotations

import logging

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import links
from .models import Checkpoint, Notification, StepStatus
from .permissions import deciders

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


def deliver(checkpoint_id: int, events) -> int:
    """Send the messages for a checkpoint's events; returns how many were sent now."""
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
                    note = Notification.objects.create(user=user, key=key, event=event,
                                                       run=checkpoint.run, subject=subject,
                                                       body=body)
            except IntegrityError:
                continue  # claimed by an earlier try of this task: never send twice
            try:
                send_mail(subject, body, None, [user.email])
            except Exception as exc:  # recorded; a resend would risk a duplicate
                log.exception("Notification %s to %s failed", key, user)
                Notification.objects.filter(pk=note.pk).update(error=str(exc)[:2000])
                continue
            Notification.objects.filter(pk=note.pk).update(sent_at=timezone.now())
            sent += 1
    return sent

"""Email notifications: one message per event per person, however often a task is retried.

A gate's mail lets a person triage without opening Tollgate: the deadline in their own time
zone and what happens when it passes, the instructions, the params and the decisions so far,
and the signed link; the requester's "approved" mail names the values the approvers chose.
Each mail has a plain-text and an HTML part (templates/mail/)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from workflows.delivery import links
from workflows.models import Checkpoint, Notification, StepStatus
from workflows.people.permissions import deciders
from workflows.reads import briefs
from workflows.specs.values import readable
from workflows.timing import clock
from workflows.timing.timezones import zone_of

log = logging.getLogger(__name__)


def _gate_brief(run, step):
    """The gate as a mail tells it: params, instructions, decisions so far, deadline, and
    what signing it means when it must be signed (the rule waiting now, else the gate's)."""
    step.run = run
    briefs.gate_evidence([step])
    step.signing, step.reject_signing = briefs.signature_to_give(step)
    step.ways_to_sign = briefs.ways_to_sign()
    return step


def render(name: str, context: dict, zone) -> tuple[str, str]:
    """(plain text, HTML) of a mail, with times in the recipient's zone."""
    with timezone.override(zone):
        return (render_to_string(f"mail/{name}.txt", context).strip() + "\n",
                render_to_string(f"mail/{name}.html", context))


def messages_for(checkpoint: Checkpoint, event: str, step_key: str):
    """(user, subject, plain text, HTML, headers) for each person this event concerns."""
    run = checkpoint.run
    step = run.steps.filter(key=step_key).first() if step_key else None
    requester = run.requested_by if run.requested_by and run.requested_by.email else None
    link = links.absolute(run.get_absolute_url())
    context = {"run": run, "run_link": link, "checkpoint": checkpoint, "event": event}
    if event in ("gate_waiting", "gate_escalated", "gate_reminded", "gate_reassigned") and (
            step is not None):
        gate = _gate_brief(run, step)
        members = deciders(run, step).exclude(email="")
        verb = {"gate_escalated": "was escalated to", "gate_reassigned": "was reassigned to",
                "gate_reminded": "still waits on"}.get(event, "waits on")
        reminder = "Reminder: " if event == "gate_reminded" else ""
        for user in members:
            zone = zone_of(user)
            due = ""
            if gate.due:
                due = f" (due {timezone.localtime(gate.due['at'], zone):%a %d %b %H:%M %Z})"
            # A link and a reply address signed for this person, this gate and this
            # attempt (see links.py); a reply cannot sign or fill in a form.
            reply_to = "" if briefs.page_only(gate) else links.reply_address(user, step)
            text, html = render("gate_waiting", {
                **context, "gate": gate, "verb": verb, "user": user, "reply_to": reply_to,
                "decide_link": links.decision_url(user, step)}, zone)
            yield (user, f"[Tollgate] {reminder}{step.title} {verb} {gate.waits_on}{due}: "
                         f"{run}", text, html, {"Reply-To": reply_to} if reply_to else {})
        if event == "gate_escalated" and requester:
            text, html = render("gate_escalated", {**context, "gate": gate},
                                 zone_of(requester))
            yield requester, f"[Tollgate] {step.title} escalated: {run}", text, html, {}
    elif event == "gate_decided" and step is not None and requester:
        outcomes = {StepStatus.COMPLETED: "approved", StepStatus.FAILED: "rejected"}
        outcome = outcomes.get(checkpoint.step_status, checkpoint.step_status)
        # The values the approvers chose on the gate's form, a later approver's over an earlier.
        chosen: dict = {}
        for values in step.approvals.filter(attempt=step.attempt, decision="approve").order_by(
                "at", "pk").values_list("values", flat=True):
            chosen.update(values or {})
        chosen = [(name, readable(value, none="null")) for name, value in chosen.items()]
        text, html = render("gate_decided", {**context, "gate": step, "outcome": outcome,
                                              "chosen": chosen}, zone_of(requester))
        yield requester, f"[Tollgate] {step.title} {outcome}: {run}", text, html, {}
    elif event == "run_failed" and requester:
        text, html = render("run_failed", context, zone_of(requester))
        yield requester, f"[Tollgate] Run failed: {run}", text, html, {}


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
        for user, subject, body, html, headers in messages_for(checkpoint, event, step_key):
            key = f"{checkpoint.run_id}:{checkpoint.seq}:{event}:{step_key}"
            try:
                with transaction.atomic():
                    note = Notification.objects.create(
                        user=user, key=key, event=event, run=checkpoint.run, subject=subject,
                        body=body, html=html, headers=headers, next_attempt_at=clock.now())
            except IntegrityError:
                continue  # recorded by an earlier try of this task: send_due has it
            sent += send(note.pk)
    return sent


def send(notification_id: int, now=None) -> bool:
    """Send one pending mail if it is due, claiming it first (two workers never send it at
    once); record the attempt. True when the server took it."""
    now = now or clock.now()
    claimed = Notification.objects.filter(
        pk=notification_id, sent_at__isnull=True, next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    note = Notification.objects.select_related("user").filter(pk=notification_id).first()
    if not claimed or note is None:
        return False
    try:
        mail = EmailMultiAlternatives(note.subject, note.body, to=[note.user.email],
                                      headers=note.headers or None)
        if note.html:
            mail.attach_alternative(note.html, "text/html")
        mail.send()
    except Exception as exc:
        attempts = note.attempts + 1
        retry = (clock.now() + timedelta(seconds=RETRY_DELAYS[attempts - 1])
                 if attempts <= len(RETRY_DELAYS) else None)
        log.warning("Mail %s to %s failed (attempt %s): %s; %s", note.key, note.user,
                    attempts, exc, f"again at {retry:%H:%M:%S}" if retry else "given up")
        Notification.objects.filter(pk=note.pk).update(
            attempts=attempts, next_attempt_at=retry, error=f"{type(exc).__name__}: {exc}"[:2000])
        return False
    Notification.objects.filter(pk=note.pk).update(
        sent_at=clock.now(), attempts=note.attempts + 1, next_attempt_at=None, error="")
    return True


def send_due(now=None, limit: int = 100) -> int:
    """Send the pending mails whose next attempt is due; returns how many went."""
    now = now or clock.now()
    due = list(Notification.objects.filter(sent_at__isnull=True, next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    return sum(send(pk, now) for pk in due)

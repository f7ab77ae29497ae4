"""What is owed the outside world: mail, webhooks and the outbox."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.timezone import now

from workflows.delivery.addresses import RefusedAddress, resolve
from workflows.timing import clock

from .runs import Run, Step


class Notification(models.Model):
    """One message per event per person; the unique key stops a retried task sending twice."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="notifications")
    key = models.CharField(max_length=200)
    event = models.CharField(max_length=40)
    run = models.ForeignKey(Run, null=True, on_delete=models.SET_NULL, related_name="+")
    subject = models.CharField(max_length=300)
    body = models.TextField()
    html = models.TextField(blank=True, default="", db_default="")  # the HTML part
    # Headers of its own: a gate's mail's Reply-To (the person's reply address), an answer's
    # In-Reply-To and References (the reply it answers).
    headers = models.JSONField(blank=True, default=dict, db_default={})
    created_at = models.DateTimeField(default=now)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Sending: tried this often; the next try is due then (none: sent, or given up).
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["user", "key"],
                                               name="notification_once_per_event_and_user")]
        indexes = [models.Index(fields=["next_attempt_at"], name="mail_due_idx",
                                condition=models.Q(sent_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.event} to {self.user_id}"


class MailReply(models.Model):
    """A reply to a gate's mail, as it came in: what it asked, and what became of it. Its
    Message-ID is unique, so a message delivered twice (or replayed) decides at most once."""

    message_id = models.CharField(max_length=300, unique=True)
    received_at = models.DateTimeField(default=now)
    sender = models.CharField(max_length=300)  # the From header, as given
    via = models.CharField(max_length=40)  # "mta" (receive_mail) or "anymail:<service>"
    # What its reply address named: whose reply it was, for which gate and attempt.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    decision = models.CharField(max_length=16, blank=True)  # "approve" or "reject" it asked
    decided = models.BooleanField(default=False)
    outcome = models.TextField()  # what was done, or why nothing was

    class Meta:
        ordering = ["-received_at"]
        verbose_name_plural = "mail replies"

    def __str__(self) -> str:
        return f"{self.message_id}: {self.outcome[:60]}"


class PushSubscription(models.Model):
    """A browser a person turned notifications on in (its PushSubscription: the push
    service's endpoint and the keys its messages are encrypted to). Removed by the person, or
    when the push service says it is gone (404 or 410)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="push_subscriptions")
    endpoint = models.URLField(max_length=1000, unique=True)
    p256dh = models.CharField(max_length=100)  # the browser's public key, base64url
    auth = models.CharField(max_length=50)  # its authentication secret, base64url
    device = models.CharField(max_length=200, blank=True)  # the browser, as it named itself
    created_at = models.DateTimeField(default=now)
    last_pushed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.user}: {self.device or self.endpoint[:60]}"


class Webhook(models.Model):
    """A URL that hears about a group's gates: waiting, decided, escalated (signed JSON)."""

    group = models.CharField(max_length=150, help_text="The approver group whose gates it hears.")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, help_text="Signs each post (HMAC-SHA256): the "
                                                         "receiver checks X-Tollgate-Signature.")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["group", "url"]
        indexes = [models.Index(fields=["group"], condition=Q(active=True),
                                name="webhook_active_group_idx")]

    def __str__(self) -> str:
        return f"{self.group} → {self.url}"

    def clean(self) -> None:
        try:
            resolve(self.url)
        except RefusedAddress as exc:
            raise ValidationError({"url": f"Webhook URL {exc}."}) from None


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One event posted to one webhook: retried until the receiver answers 2xx or the
    attempts run out, each attempt recorded. The unique key stops an event being planned
    twice; a receiver dedupes with X-Tollgate-Delivery (a post may be repeated)."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    key = models.CharField(max_length=200)
    event = models.CharField(max_length=40)
    run = models.ForeignKey(Run, null=True, on_delete=models.SET_NULL, related_name="+")
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus,
                              default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=clock.now)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # When a doorbell for it was last put on the queue: one pending message per row.
    rung_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["webhook", "key"],
                                               name="webhook_delivery_once_per_event")]
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(status="pending"),
                                name="webhook_delivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.event} to {self.webhook_id} ({self.status})"


class OutboxJob(models.TextChoices):
    NOTIFY = "notify", "mail the people concerned"
    WEBHOOKS = "webhooks", "post to the group's webhooks"
    PARENT = "parent", "tell the parent run its child ended"
    CHILDREN = "children", "cancel the run's open child runs"
    CHAT = "chat", "post or update the gate's chat messages"


class OutboxMessage(models.Model):
    """What a transition owes the outside world (mail, webhooks), written in the
    transition's own transaction and delivered from here: a queue that is down, or a worker
    that dies, loses none of it. Done once `done_at` is set; retried with backoff."""

    # The checkpoint by its place in the run: the row is written before the checkpoint's.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    seq = models.PositiveIntegerField()
    job = models.CharField(max_length=16, choices=OutboxJob)
    events = models.JSONField()  # [[event, step key], ...]
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=clock.now)
    attempts = models.PositiveIntegerField(default=0)
    rung_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(done_at__isnull=True),
                                name="outbox_due_idx")]

    def __str__(self) -> str:
        return f"{self.job} for run {self.run_id} #{self.seq}"


class ChatMessage(models.Model):
    """A gate's message in a chat channel (one per gate attempt and channel): where it is,
    so that every decision, wherever it was made, updates it."""

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="chat_messages")
    attempt = models.PositiveIntegerField()
    provider = models.CharField(max_length=20)
    channel = models.CharField(max_length=100)
    ref = models.CharField(max_length=100, blank=True)  # Slack's ts; empty until posted
    posted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    # The gate no longer waits and the message says how it ended: nothing more to update.
    final = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["step", "attempt", "provider", "channel"], name="chat_message_once")]

    def __str__(self) -> str:
        return f"{self.provider} {self.channel} {self.ref or '(not posted)'}"


class ChatInteraction(models.Model):
    """A verified request from chat (a button press, a submitted form), kept until it is
    handled: acknowledged at once, decided after, and never lost to a dead worker. Its
    signature is unique, so a replayed request is refused."""

    provider = models.CharField(max_length=20)
    digest = models.CharField(max_length=64, unique=True)
    payload = models.JSONField()
    received_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=clock.now)
    attempts = models.PositiveIntegerField(default=0)
    done_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(done_at__isnull=True),
                                name="chat_interaction_due_idx")]

    def __str__(self) -> str:
        return f"{self.provider} interaction {self.pk}"

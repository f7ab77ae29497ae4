"""API tokens and each person's preferences."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.utils import timezone


class ApiTokenManager(models.Manager):
    def issue(self, user, name: str = "", *, actor=None) -> tuple[ApiToken, str]:
        """Create a token; the raw value is returned once and only its hash is kept.

        A person mints tokens for themselves only (a superuser for anyone): a token acts as
        its user. The system (commands: `actor` None) may mint for anyone."""
        import secrets

        if actor is not None and actor.pk != user.pk and not actor.is_superuser:
            raise PermissionDenied(f"{actor.get_username()} may mint API tokens only for "
                                   "themselves.")

        raw = "tg_" + secrets.token_urlsafe(32)
        token = self.create(user=user, name=name or "API token", prefix=raw[:10],
                            key_hash=ApiToken.hash(raw))
        return token, raw


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenManager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def save(self, *args, **kwargs):
        if self.pk and self.revoked_at is None and ApiToken.objects.filter(
                pk=self.pk, revoked_at__isnull=False).exists():
            raise ValidationError("A revoked token stays revoked; issue a new one.")
        super().save(*args, **kwargs)

    @staticmethod
    def hash(raw: str) -> str:
        import hashlib

        return hashlib.sha256(raw.encode()).hexdigest()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Preference(models.Model):
    """What a person sets for themselves: the time zone their pages show times in (empty:
    the site's, TIME_ZONE), a daily digest, and while they are away, who decides their
    gates. Their manager (a gate's `manager` rule) is set by an admin or by the sign-on
    provider's claim."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="tollgate_preference")
    time_zone = models.CharField(max_length=64, blank=True)
    away_from = models.DateTimeField(null=True, blank=True)
    away_until = models.DateTimeField(null=True, blank=True)
    delegate = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="delegations",
        help_text="Decides this person's gates from away_from to away_until.")
    manager = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="reports", help_text="Decides the gates whose rule names the requester's "
                                          "manager.")
    # One mail a day at this hour of the person's own time zone, listing every gate that
    # waits on them (none: no digest); the day it was last sent, in that zone.
    digest_hour = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The hour (0-23, in the person's time zone) of a "
                                         "daily mail listing the gates that wait on them.")
    digest_sent_on = models.DateField(null=True, blank=True)

    class Meta:
        # The model's plain change permission is not enough to give approval power: a manager
        # or a delegate decides someone else's gates.
        permissions = [("set_approval_power", "Can set anyone's manager and delegate")]
        constraints = [
            models.CheckConstraint(condition=~models.Q(delegate=models.F("user")),
                                   name="preference_delegate_not_self"),
            models.CheckConstraint(condition=~models.Q(manager=models.F("user")),
                                   name="preference_manager_not_self"),
            models.CheckConstraint(condition=models.Q(digest_hour__lte=23),
                                   name="preference_digest_hour_of_a_day"),
            # An away period has both ends, in order, and a delegate; or it is not set.
            models.CheckConstraint(
                condition=models.Q(away_from__isnull=True, away_until__isnull=True)
                | models.Q(away_from__isnull=False, away_until__gt=models.F("away_from"),
                           delegate__isnull=False),
                name="preference_away_period"),
        ]
        indexes = [models.Index(fields=["delegate", "away_until"],
                                condition=models.Q(delegate__isnull=False),
                                name="preference_delegate_idx"),
                   # The people whose digest may be due (digests.due).
                   models.Index(fields=["digest_hour"],
                                condition=models.Q(digest_hour__isnull=False),
                                name="preference_digest_idx")]

    def __str__(self) -> str:
        return f"{self.user}: {self.time_zone or 'site time zone'}"

    def clean(self) -> None:
        from zoneinfo import available_timezones

        errors = {}
        if self.time_zone and self.time_zone not in available_timezones():
            errors["time_zone"] = f"Unknown time zone {self.time_zone!r}."
        if self.delegate_id and self.delegate_id == self.user_id:
            errors["delegate"] = "A person cannot be their own delegate."
        if self.manager_id and self.manager_id == self.user_id:
            errors["manager"] = "A person cannot be their own manager."
        if (self.away_from is None) != (self.away_until is None):
            errors["away_until"] = "An away period needs both its start and its end."
        elif self.away_from and self.away_until <= self.away_from:
            errors["away_until"] = "The away period must end after it starts."
        elif self.away_from and not self.delegate_id:
            errors["delegate"] = "Name who decides your gates while you are away."
        if errors:
            raise ValidationError(errors)

    def delegating_at(self, now) -> bool:
        """Is the delegate deciding for this person at `now`?"""
        return bool(self.delegate_id and self.away_from and self.away_from <= now
                    < self.away_until)


class SsoIdentity(models.Model):
    """A person's account at the company's OpenID Connect provider (issuer and subject),
    with the e-mail the provider last vouched for: chat accounts are matched by it."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="sso_identities")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    email = models.EmailField(blank=True)
    email_verified = models.BooleanField(default=False)
    groups = models.JSONField(default=list, blank=True)  # the claim as last seen
    # Entra ID's object id and tenant ("oid", "tid"), when the provider gives them: Teams
    # accounts are matched by them.
    object_id = models.CharField(max_length=64, blank=True, default="", db_default="")
    tenant_id = models.CharField(max_length=64, blank=True, default="", db_default="")
    first_seen = models.DateTimeField(default=timezone.now)
    last_sign_in = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "SSO identity"
        verbose_name_plural = "SSO identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"],
                                               name="sso_identity_one_per_subject")]
        indexes = [models.Index(fields=["email"], name="sso_identity_email_idx",
                                condition=models.Q(email_verified=True)),
                   models.Index(fields=["object_id"], name="sso_identity_object_id_idx",
                                condition=~models.Q(object_id=""))]

    def __str__(self) -> str:
        return f"{self.user} at {self.issuer}"


class ChatIdentity(models.Model):
    """A chat account (Slack: workspace and user id; Teams: tenant and Entra object id)
    that acts as a Tollgate user: matched
    by a verified e-mail from sign-on, or confirmed by the person through a one-time link."""

    provider = models.CharField(max_length=20)  # "slack"
    team = models.CharField(max_length=64)
    chat_user = models.CharField(max_length=64)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="chat_identities")
    name = models.CharField(max_length=200, blank=True)  # the chat's handle, for the audit
    matched_by = models.CharField(max_length=20)  # "email", "object id" or "link"
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "chat identities"
        # A chat account linked to someone decides as them: its own permission, not add.
        permissions = [("link_chat_identity", "Can link a chat account to anyone")]
        constraints = [models.UniqueConstraint(fields=["provider", "team", "chat_user"],
                                               name="chat_identity_one_per_account")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.team}/{self.chat_user} as {self.user}"

    @property
    def label(self) -> str:
        """How the audit names it: "slack:T1/U2 @ann" (a Slack handle), "teams:<tenant>/
        <object id> Ann Smith" (a Teams display name)."""
        name = f"@{self.name}" if self.name and self.provider == "slack" else self.name
        return f"{self.provider}:{self.team}/{self.chat_user}" + (f" {name}" if name else "")


class Passkey(models.Model):
    """A WebAuthn credential a person registered (a security key, a phone, the computer's
    own authenticator): it signs decisions (workflows.web.passkeys). Only its public key is
    kept; the counter catches a cloned authenticator replaying its signatures."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="passkeys")
    name = models.CharField(max_length=100)
    credential_id = models.BinaryField(max_length=1023, unique=True)
    public_key = models.BinaryField()
    sign_count = models.PositiveBigIntegerField(default=0)
    transports = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user_id", "created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

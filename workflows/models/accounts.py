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
    the site's, TIME_ZONE)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="tollgate_preference")
    time_zone = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.user}: {self.time_zone or 'site time zone'}"

    def clean(self) -> None:
        from zoneinfo import available_timezones

        from django.core.exceptions import ValidationError

        if self.time_zone and self.time_zone not in available_timezones():
            raise ValidationError({"time_zone": f"Unknown time zone {self.time_zone!r}."})

"""Workflow specs: versioned definitions, one active version per name."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class SpecStatus(models.TextChoices):
    ACTIVE = "active"
    ARCHIVED = "archived"
    ONE_OFF = "one_off", "one-off (a run's inline steps)"


class WorkflowSpec(models.Model):
    name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField()
    description = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=SpecStatus, default=SpecStatus.ACTIVE)
    definition = models.JSONField(help_text="The validated spec, as loaded.")
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "-version"]
        verbose_name = "workflow spec"
        permissions = [("author_command_spec",
                        "Can load specs that run commands or shell on the workers")]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="spec_name_version_unique"),
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(status=SpecStatus.ACTIVE),
                name="spec_one_active_version",
                violation_error_message="Only one version of a spec may be active.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class SpecOwner(models.Model):
    """Who a spec name belongs to: the person (or group) that first loaded it, unless an
    admin says otherwise. Its new versions, its one-off runs and steps added to its runs
    (which reach the secrets TOLLGATE_SECRET_GRANTS grants the name) are theirs to write.
    A name with neither is an admin's (first loaded by a command, or before owners)."""

    name = models.SlugField(max_length=100, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="owned_specs")
    group = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="owned_specs",
                              help_text="Everyone in it may load new versions too.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.user or self.group or 'admins'}"

"""Workflow specs: versioned definitions, one active version per name."""

from __future__ import annotations

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

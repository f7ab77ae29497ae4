"""The goal hierarchy: an adjacency list (parent), and its closure (GoalLink) for reading."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import tree


class GoalStatus(models.TextChoices):
    ACTIVE = "active"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"


CLOSED_GOAL_STATUSES = (GoalStatus.COMPLETED, GoalStatus.ABANDONED, GoalStatus.CANCELLED)


class Priority(models.TextChoices):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    CRITICAL = "critical"


class Goal(models.Model):
    title = models.CharField(max_length=200)
    objective = models.TextField(blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    status = models.CharField(max_length=16, choices=GoalStatus, default=GoalStatus.ACTIVE)
    priority = models.CharField(max_length=16, choices=Priority, default=Priority.NORMAL)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_goals",
    )
    # Who opened it (None: the system, or opened before goals recorded it).
    opened_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="+", editable=False)
    next_action = models.CharField(max_length=500, blank=True)
    success_signal = models.CharField(max_length=500, blank=True)
    blocker_reason = models.CharField(max_length=500, blank=True)
    shared_state = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["title", "id"]
        indexes = [models.Index(fields=["parent", "status"]), models.Index(fields=["status"])]
        constraints = [
            models.CheckConstraint(condition=~Q(parent=F("pk")), name="goal_not_own_parent"),
            models.CheckConstraint(
                condition=Q(status=GoalStatus.BLOCKED, blocker_reason__gt="")
                | (~Q(status=GoalStatus.BLOCKED) & Q(blocker_reason="")),
                name="goal_blocker_reason_iff_blocked",
                violation_error_message="A blocked goal needs a blocker reason; "
                "other goals have none.",
            ),
            models.CheckConstraint(
                condition=Q(status__in=CLOSED_GOAL_STATUSES, closed_at__isnull=False)
                | (~Q(status__in=CLOSED_GOAL_STATUSES) & Q(closed_at__isnull=True)),
                name="goal_closed_at_iff_closed",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    def save(self, *args, **kwargs) -> None:
        # The bookkeeping follows the status, whichever path changed it.
        self.sync_status_fields()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "blocker_reason", "closed_at", "updated_at"}
        adding = self._state.adding or self.pk is None
        with transaction.atomic():
            moved = not adding and (update_fields is None or "parent" in update_fields) and (
                Goal.objects.filter(pk=self.pk).values_list("parent_id", flat=True).first()
                != self.parent_id)
            super().save(*args, **kwargs)
            # The closure (GoalLink) follows the parent, in the same transaction.
            if adding:
                tree.link(self.pk, self.parent_id)
            elif moved:
                tree.move(self.pk, self.parent_id)


    def get_absolute_url(self) -> str:
        from django.urls import reverse

        return reverse("goal_detail", args=[self.pk])

    @property
    def is_closed(self) -> bool:
        return self.status in CLOSED_GOAL_STATUSES

    def sync_status_fields(self) -> None:
        """Closing stamps closed_at, reopening clears it; unblocking clears the blocker."""
        if self.status != GoalStatus.BLOCKED:
            self.blocker_reason = ""
        if self.is_closed:
            self.closed_at = self.closed_at or timezone.now()
        else:
            self.closed_at = None

    def clean(self) -> None:
        self.sync_status_fields()
        if self.status == GoalStatus.BLOCKED and not self.blocker_reason.strip():
            raise ValidationError({"blocker_reason": ValidationError(
                "A blocked goal needs a blocker reason.", code="needs_reason")})
        if (self.parent_id is not None and self.pk is not None
                and self.pk in tree.ancestor_ids(self.parent_id)):
            raise ValidationError({"parent": ValidationError(
                f"Goal {self.pk} ({self.title}) cannot be its own ancestor: goal "
                f"{self.parent_id} is beneath it.", code="cycle")})


class GoalLink(models.Model):
    """The hierarchy's closure: a row for each goal and each of its ancestors, itself
    included at depth 0. Goal.save keeps it in the transaction that sets the parent, so a
    subtree or a chain of ancestors is one indexed lookup, never a recursive walk."""

    ancestor = models.ForeignKey(Goal, on_delete=models.CASCADE, related_name="+")
    descendant = models.ForeignKey(Goal, on_delete=models.CASCADE, related_name="+")
    depth = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["ancestor", "descendant"],
                                               name="goal_link_once")]
        indexes = [models.Index(fields=["descendant", "depth"])]

    def __str__(self) -> str:
        return f"goal {self.descendant_id} under {self.ancestor_id} ({self.depth})"

    @classmethod
    def subtree(cls, root_id: int):
        """The ids of a goal and every goal under it, as a subquery for `goal_id__in=`."""
        return cls.objects.filter(ancestor_id=root_id).values("descendant_id")

"""Who a gate waits on: the approval rules of its spec that matched the run, one row per
rule per attempt of the gate (see `workflows.engine.policy`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .runs import Step


class GateRule(models.Model):
    """One rule a gate's attempt must meet: `required` approvals from distinct people of a
    group (or from one person: the requester's manager, or whom an operator reassigned it
    to). Rules of a higher `order` open once the lower ones are met; `open` is true while a
    rule waits on its approvers (its stage open, not met, the gate waiting)."""

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="approval_rules",
                             db_index=False)
    attempt = models.PositiveIntegerField()
    position = models.PositiveIntegerField(help_text="The rule's place in the spec's list.")
    order = models.PositiveIntegerField(default=0)
    label = models.CharField(max_length=200)
    group = models.CharField(max_length=150, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.PROTECT, related_name="+")
    # Why its person decides, when a rule of the spec chose them ("alice's manager").
    role = models.CharField(max_length=200, blank=True, default="", db_default="")
    required = models.PositiveIntegerField(default=1)
    allow_self_approval = models.BooleanField(default=False)
    # What a decision toward this rule means when signed (its spec's `signature`; a gate's
    # own applies to every rule): blank, unsigned unless the gate asks.
    signature_meaning = models.CharField(max_length=200, blank=True, default="",
                                         db_default="")
    approvals = models.PositiveIntegerField(default=0)
    rejections = models.PositiveIntegerField(default=0)
    open = models.BooleanField(default=False)
    opened_at = models.DateTimeField(null=True, blank=True)
    met_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["step_id", "attempt", "order", "position"]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt", "position"],
                                    name="gate_rule_unique_position"),
            models.CheckConstraint(condition=Q(required__gte=1), name="gate_rule_required"),
            # A rule waits on a group or on one person, never on both or neither.
            models.CheckConstraint(
                condition=(Q(group="") & Q(user__isnull=False))
                | (~Q(group="") & Q(user__isnull=True)),
                name="gate_rule_group_or_person"),
        ]
        indexes = [
            # Whose inbox a waiting rule is in: by group, and by person.
            models.Index(fields=["group"], condition=Q(open=True), name="gate_rule_open_idx"),
            models.Index(fields=["user"], condition=Q(open=True, user__isnull=False),
                         name="gate_rule_open_user_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step_id}#{self.attempt} {self.label}"

    @property
    def audience(self) -> str:
        """Whom it waits on, as pages say it: the group, or the person (and why them:
        "dave (alice's manager)")."""
        if self.group:
            return self.group
        name = self.user.get_username() if self.user else ""
        return f"{name} ({self.role})" if name and self.role else name

    @property
    def met(self) -> bool:
        return self.met_at is not None

"""Schedules and the slots they fired."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.timezone import now

from workflows.specs.params import FieldErrors, coerce

from .runs import Run
from .specs import SpecStatus, WorkflowSpec


class ScheduleError(ValueError):
    pass



def validate_schedule(schedule: Schedule) -> None:
    if bool(schedule.cron) == bool(schedule.interval_seconds):
        raise ScheduleError("Give a cron expression or an interval in seconds (one of them).")
    if schedule.cron and not croniter.is_valid(schedule.cron):
        raise ScheduleError(f"{schedule.cron!r} is not a valid cron expression.")
    try:
        ZoneInfo(schedule.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"Unknown timezone {schedule.timezone!r}.") from None
    spec = (WorkflowSpec.objects.filter(name=schedule.spec_name)
            .order_by("status", "-version").first())  # the active one sorts first
    if spec is None:
        raise ScheduleError(f"No spec named {schedule.spec_name!r}; load it first.")
    try:
        coerce(spec.definition.get("params", []), schedule.params or None)
    except FieldErrors as exc:
        raise ScheduleError(str(exc)) from None
    if schedule.enabled and not WorkflowSpec.objects.filter(
            name=schedule.spec_name, status=SpecStatus.ACTIVE).exists():
        raise ScheduleError(f"Spec {schedule.spec_name!r} has no active version; activate one "
                            "or leave the schedule disabled.")
    if schedule.retry_limit and not schedule.retry_delay_seconds:
        raise ScheduleError("A schedule that opens failed slots again needs a delay of at "
                            "least 1 second (retry_delay_seconds).")


class OverlapPolicy(models.TextChoices):
    SKIP = "skip", "Skip while the previous run is open"
    ALLOW = "allow", "Allow overlapping runs"


class MissedPolicy(models.TextChoices):
    RUN_ONCE = "run_once", "Run once for all missed slots"
    SKIP = "skip", "Skip missed slots"


class Schedule(models.Model):
    name = models.CharField(max_length=100, unique=True)
    spec_name = models.SlugField(max_length=100, help_text="Runs start the spec's active version.")
    goal = models.ForeignKey("goals.Goal", null=True, blank=True, on_delete=models.SET_NULL)
    cron = models.CharField(max_length=100, blank=True, help_text="e.g. '0 2 * * 1-5'")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    overlap = models.CharField(max_length=8, choices=OverlapPolicy, default=OverlapPolicy.SKIP)
    missed = models.CharField(max_length=8, choices=MissedPolicy, default=MissedPolicy.RUN_ONCE)
    shared_state = models.JSONField(default=dict, blank=True)
    params = models.JSONField(default=dict, blank=True,
                              help_text='Fixed values for the spec\'s params: {"env": "prod"}')
    next_run_at = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True,
                                 help_text="No slot after this moment: the schedule then ends.")
    retry_limit = models.PositiveSmallIntegerField(
        default=0, db_default=0,
        help_text="A slot whose run failed is opened again, up to this many times (0: never).")
    retry_delay_seconds = models.PositiveIntegerField(
        default=300, db_default=300,
        help_text="How long after a slot's run failed it is opened again.")
    missed_count = models.PositiveIntegerField(default=0, editable=False)
    paused_reason = models.CharField(max_length=300, blank=True, editable=False,
                                     help_text="Why the schedule paused itself, if it did.")
    skipped_count = models.PositiveIntegerField(default=0, editable=False)
    last_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+", editable=False)
    reuse = models.CharField(
        max_length=8, choices=[("open", "open"), ("any", "any"), ("none", "none")],
        default="open", db_default="open",
        help_text="A slot's idempotency key already used (schedule:ID:SLOT, or by a start "
                  "that named it): return its open run (open), its latest run (any), or skip "
                  "the slot (none).")
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["next_run_at"], condition=Q(enabled=True),
                                name="schedule_due_idx")]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__gte=1))
                | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="schedule_cron_xor_interval",
                violation_error_message="Give a cron expression or an interval, not both.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        try:
            validate_schedule(self)
        except ScheduleError as exc:
            raise ValidationError(str(exc)) from None


class FireOutcome(models.TextChoices):
    STARTED = "started"
    SKIPPED = "skipped"
    MISSED = "missed"
    FAILED = "failed", "could not start"


class ScheduleFire(models.Model):
    """One slot of a schedule and what became of it: started (with its run: the latest, when
    a failed run was opened again), skipped, missed or not started, with the reason. The
    database refuses to handle a slot twice."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="fires")
    slot_at = models.DateTimeField()
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    outcome = models.CharField(max_length=8, choices=FireOutcome, default=FireOutcome.STARTED,
                               db_default=FireOutcome.STARTED)
    reason = models.CharField(max_length=300, blank=True, db_default="", default="")
    retries = models.PositiveSmallIntegerField(default=0, db_default=0)  # runs opened again
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-slot_at"]
        constraints = [models.UniqueConstraint(fields=["schedule", "slot_at"],
                                               name="schedule_slot_once")]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.slot_at:%Y-%m-%d %H:%M}"

"""Consumers and periodic tasks, as they report themselves."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Worker(models.Model):
    """A consumer process as it last reported itself: who it is (the holder identity leases
    record), when it started and was last seen, and what it held then."""

    host = models.CharField(max_length=200)
    boot_id = models.CharField(max_length=64, blank=True)
    pidns = models.CharField(max_length=40, blank=True)
    pid = models.PositiveIntegerField()
    started = models.BigIntegerField(null=True, blank=True)  # the process's start time
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    holds = models.JSONField(default=list, blank=True)  # ["step:12", "compensation:3"]

    class Meta:
        ordering = ["-last_seen"]
        constraints = [models.UniqueConstraint(
            fields=["host", "boot_id", "pidns", "pid", "started"], name="worker_identity")]
        indexes = [models.Index(fields=["-last_seen"], name="worker_last_seen_idx")]

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}"


class PeriodicRun(models.Model):
    """The last run of each periodic task (sweeper, schedules, deadlines, outbox): an
    operator sees that they run, and how long they take."""

    name = models.CharField(max_length=100, unique=True)
    last_started = models.DateTimeField()
    last_finished = models.DateTimeField(null=True, blank=True)
    last_seconds = models.FloatField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    runs = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return self.name

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


class AuditSeal(models.Model):
    """A run's audit chain signed at a point (workflows.audit.seals): the deployment's key
    vouches that checkpoint `seq` of run `run_id` had hash `hash` at `at`, so a chain
    rewritten afterwards from any earlier point no longer matches. Seals form a chain of
    their own (`prev`: the digest of the seal before), so one deleted from the middle is
    found. `seq` 0 is a tombstone: the run was pruned (its chain ended at `hash`). The run
    is named by id only: a seal outlives its run."""

    run_id = models.BigIntegerField()
    seq = models.PositiveIntegerField()
    hash = models.CharField(max_length=64)
    at = models.DateTimeField()
    prev = models.CharField(max_length=64, unique=True)  # two sealers cannot fork the chain
    digest = models.CharField(max_length=64, unique=True)
    signature = models.CharField(max_length=128)
    key_id = models.CharField(max_length=16)

    class Meta:
        indexes = [models.Index(fields=["run_id", "-seq"], name="audit_seal_run_idx")]

    def __str__(self) -> str:
        return f"seal of run {self.run_id} at #{self.seq}"


class AuditTimestamp(models.Model):
    """An RFC 3161 timestamp of the seal chain (workflows.audit.timestamps): an outside
    authority signed that the seal whose digest is `seal_digest` (and so, through each
    seal's `prev`, every seal before it) existed at `at`. `token` is the authority's whole
    answer (DER), verifiable without Tollgate."""

    seal_digest = models.CharField(max_length=64, unique=True)
    seal_id = models.BigIntegerField()
    at = models.DateTimeField(help_text="The time the authority signed (its genTime).")
    token = models.BinaryField()
    authority = models.CharField(max_length=300)

    class Meta:
        ordering = ["seal_id"]

    def __str__(self) -> str:
        return f"timestamp of seal {self.seal_id} at {self.at:%Y-%m-%d %H:%M:%S}"

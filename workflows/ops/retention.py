"""Keeping the database in bounds.

`prune_records` (a periodic task, hourly) deletes what only explains the past: finished
webhook deliveries, notification records, schedule slots, delivered outbox messages, handled
chat presses and workers not seen for a week, each older than its TOLLGATE_KEEP_*_DAYS setting.

`prune_runs` (manage.py prune_runs --older-than DAYS) takes finished runs out: each batch is
first written, checkpoints and decisions with it, as JSON lines in the audit export's shape
and flushed to disk, and only then deleted. Checkpoints and decisions are never deleted any
other way (their querysets refuse it); this is the one explicit path, for an operator.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef

from workflows.audit import seals
from workflows.models import (
    TERMINAL_RUN_STATUSES,
    Approval,
    ChatInteraction,
    Checkpoint,
    Compensation,
    Notification,
    OutboxMessage,
    Run,
    Schedule,
    ScheduleFire,
    Step,
    StepStatus,
    WebhookDelivery,
    Worker,
)
from workflows.reads import live
from workflows.reads.selectors import run_audit
from workflows.timing import clock

BATCH = 1000


def _delete_in_batches(queryset) -> int:
    deleted = 0
    while True:
        ids = list(queryset.values_list("pk", flat=True)[:BATCH])
        if not ids:
            return deleted
        deleted += queryset.model.objects.filter(pk__in=ids).delete()[0]


def prune_records(now=None) -> dict[str, int]:
    """Delete the old records each retention setting names; returns how many of each."""
    now = now or clock.now()

    def before(days: float):
        return now - timedelta(days=days)

    return {
        "webhook_deliveries": _delete_in_batches(WebhookDelivery.objects.exclude(
            status="pending").filter(created_at__lt=before(
                settings.TOLLGATE_KEEP_DELIVERIES_DAYS))),
        "notifications": _delete_in_batches(Notification.objects.filter(
            created_at__lt=before(settings.TOLLGATE_KEEP_NOTIFICATIONS_DAYS))),
        "schedule_fires": _delete_in_batches(ScheduleFire.objects.filter(
            slot_at__lt=before(settings.TOLLGATE_KEEP_SCHEDULE_FIRES_DAYS))),
        "outbox_messages": _delete_in_batches(OutboxMessage.objects.filter(
            done_at__lt=before(settings.TOLLGATE_KEEP_OUTBOX_DAYS))),
        # A press older than chat's five-minute signature window cannot be replayed, so its
        # digest is no longer needed to refuse one.
        "chat_interactions": _delete_in_batches(ChatInteraction.objects.filter(
            done_at__lt=before(settings.TOLLGATE_KEEP_OUTBOX_DAYS))),
        "workers": _delete_in_batches(Worker.objects.filter(last_seen__lt=before(7))),
        "page_versions": live.forget_old(),
    }


def settled(runs):
    """Of these finished runs, those no parent still waits on: a child run whose parent's
    step has not yet heard that it ended stays (the parent reads it when it does)."""
    waiting = Step.objects.filter(child_run=OuterRef("pk"), status=StepStatus.RUNNING)
    return runs.filter(status__in=TERMINAL_RUN_STATUSES).exclude(Exists(waiting))


def finished_runs(older_than_days: float, now=None):
    """Runs that ended more than this many days ago and that no parent waits on (open runs
    are never taken)."""
    now = now or clock.now()
    return settled(Run.objects.filter(finished_at__lt=now - timedelta(days=older_than_days))
                   ).order_by("pk")


def prune_runs(older_than_days: float, out, *, batch: int = 200, now=None) -> int:
    """Export (JSON lines to `out`, a text file) then delete the finished runs older than
    this, `batch` runs to a transaction. Returns how many runs were deleted."""
    deleted = 0
    candidates = finished_runs(older_than_days, now)
    while True:
        runs = list(candidates.select_related("spec")[:batch])
        if not runs:
            return deleted
        ids = [run.pk for run in runs]
        for run in runs:
            out.write(json.dumps(run_audit(run), default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())  # on disk before anything of them is deleted
        with transaction.atomic():
            # Only runs still finished and not locked by anyone: a retried run moves on.
            still = list(settled(Run.objects.select_for_update().filter(pk__in=ids))
                         .values_list("pk", flat=True))
            _delete_runs(still)
        deleted += len(still)


# One transaction (a savepoint within the prune's): the tombstones, the permission the
# append-only trigger asks for, and the deletions stand or fall together.
@transaction.atomic
def _delete_runs(run_ids: list[int]) -> None:
    if not run_ids:
        return
    steps = Step.objects.filter(run_id__in=run_ids)
    # What is deleted is signed as deleted (a tombstone seal), so verify_audit tells it from
    # a run someone removed behind the application's back.
    seals.seal_pruned(list(Run.objects.filter(pk__in=run_ids).values_list("pk", "chain_head")))
    # The audit trail refuses deletion through the ORM, and in the database: on PostgreSQL
    # unless the run has the tombstone written above (migration 0058); this path was
    # exported first.
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":  # SQLite: a row of this transaction's own
            cursor.execute("INSERT INTO tollgate_audit_unlock VALUES ('retention')")
        for model, column, values in (
                (Checkpoint, "run_id", run_ids),
                (Approval, "step_id", list(steps.values_list("pk", flat=True)))):
            if values:
                marks = ", ".join(["%s"] * len(values))
                cursor.execute(f"DELETE FROM {model._meta.db_table} "  # noqa: S608
                               f"WHERE {column} IN ({marks})", values)
        if connection.vendor != "postgresql":
            cursor.execute("DELETE FROM tollgate_audit_unlock")
    Run.objects.filter(parent_step__run_id__in=run_ids).update(parent_step=None)
    Schedule.objects.filter(last_run_id__in=run_ids).update(last_run=None)
    Compensation.objects.filter(run_id__in=run_ids).delete()
    steps.delete()
    Run.objects.filter(pk__in=run_ids).delete()

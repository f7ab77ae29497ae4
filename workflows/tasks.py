"""Huey tasks: thin doorbells over the worker and sweeper functions.

Tasks return nothing (periodic ones too): nobody reads their results, and Huey would keep
each in its result store for good. What they did is logged, and recorded in the database.
"""

from __future__ import annotations

import logging

from django.conf import settings
from huey import crontab
from huey.consumer import Scheduler
from huey.contrib.djhuey import db_periodic_task, db_task, on_startup, task

from goals.rollup import fold_days, fold_tallies
from workflows.audit import seals, timestamps
from workflows.chat import interactions, providers
from workflows.delivery import digests, dispatch, notifications, outbox, webhooks
from workflows.models import WebhookDelivery
from workflows.ops import retention
from workflows.recovery import presence, sweeper
from workflows.timing import deadlines, schedules
from workflows.workers import worker

log = logging.getLogger(__name__)

# Huey looks at periodic tasks once a minute; the sweeper must run every
# TOLLGATE_SWEEP_SECONDS, and every periodic task here is safe to run that often.
Scheduler.periodic_task_seconds = settings.TOLLGATE_SWEEP_SECONDS


PERIODIC_PRIORITY = 10  # doorbells carry their run's priority rank, 0 to 3


def every_tick(_now) -> bool:
    return True


@on_startup()
def record_orphans() -> None:
    """A consumer starting on a machine records what one that died there had finished, and
    starts reporting itself (the workers page)."""
    from django.db import close_old_connections

    presence.start()
    try:
        recorded = worker.record_orphans(force=True)
        if recorded:
            log.info("recorded %s result(s) a stopped consumer had finished", recorded)
    except Exception:
        log.exception("Could not record the spool's orphaned results")
    finally:
        close_old_connections()


@db_task()
def work() -> None:
    """A doorbell: claim and run whatever steps the runs have for a worker."""
    ran = worker.work()
    if ran:
        log.info("ran %s step(s)", ran)


@db_task()
def compensate_run(run_id: int) -> None:
    log.info("run %s: compensated %s", run_id, worker.compensate_run(run_id))


# The periodic tasks go before doorbells: a flood of work must not delay the sweeper.
@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def sweep() -> None:
    with presence.periodic("sweep"):
        report = sweeper.sweep()
    if report.expired or report.rerung:
        log.info("sweep: %s lease(s) reclaimed, %s run(s) rung again", report.expired,
                 report.rerung)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def start_scheduled_runs() -> None:
    with presence.periodic("start_scheduled_runs"):
        report = schedules.tick()
    if report.started or report.skipped or report.missed:
        log.info("schedules: started %s, skipped %s, missed %s", report.started,
                 report.skipped, report.missed)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def apply_gate_deadlines() -> None:
    with presence.periodic("apply_gate_deadlines"):
        deadlines.apply()


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def send_gate_reminders() -> None:
    with presence.periodic("send_gate_reminders"):
        deadlines.remind()


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def fold_goal_tallies() -> None:
    with presence.periodic("fold_goal_tallies"):
        fold_tallies()
        fold_days()


def every_seal(_now) -> bool:
    """Huey's ticks, thinned to one each TOLLGATE_AUDIT_SEAL_SECONDS (a tick is a minute
    or TOLLGATE_SWEEP_SECONDS; sealing more often than asked does no harm)."""
    period = max(settings.TOLLGATE_AUDIT_SEAL_SECONDS, settings.TOLLGATE_SWEEP_SECONDS)
    return int(_now.timestamp()) % int(period) < settings.TOLLGATE_SWEEP_SECONDS


@db_periodic_task(every_seal, priority=PERIODIC_PRIORITY)
def seal_audit_chains() -> None:
    """Seal the chains that moved, then (with TOLLGATE_AUDIT_TSA_URL) have the newest seal
    timestamped; an authority that does not answer fails this run of the task (the
    workers page and tollgate_periodic_failed say so) and is asked again next time."""
    with presence.periodic("seal_audit_chains"):
        seals.seal()
        if timestamps.enabled():
            timestamps.stamp()


@db_task()
def deliver_outbox(message_id: int) -> None:
    """A doorbell for an outbox message: mail or webhooks a transition owes."""
    outbox.deliver(message_id)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def ring_due_outbox() -> None:
    """Ring again for outbox messages whose doorbell was lost or whose retry is due."""
    with presence.periodic("ring_due_outbox"):
        due = outbox.due_to_ring()
        for message_id in due:
            dispatch.deliver_outbox(message_id)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def send_due_mail() -> None:
    """Send again the mails the mail server did not take (down, refusing) when due."""
    with presence.periodic("send_due_mail"):
        notifications.send_due()


@db_periodic_task(crontab(), priority=PERIODIC_PRIORITY)
def send_daily_digests() -> None:
    """Each minute: the digests whose hour has come in their person's time zone."""
    with presence.periodic("send_daily_digests"):
        digests.send_digests()


@db_task()
def handle_chat_press(interaction_id: int) -> None:
    """A doorbell for a press in chat, acknowledged already: decide it."""
    interactions.handle_any(interaction_id)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def handle_due_chat_presses() -> None:
    """Presses whose doorbell was lost, or whose retry is due (chat away), handled here."""
    if not providers.any_enabled():
        return
    with presence.periodic("handle_due_chat_presses"):
        for interaction_id in interactions.due():
            interactions.handle_any(interaction_id)


@db_task()
def deliver_webhook(delivery_id: int) -> None:
    if webhooks.deliver(delivery_id) == "pending":  # refused or unreachable: try again later
        retry_at = (WebhookDelivery.objects.filter(pk=delivery_id)
                    .values_list("next_attempt_at", flat=True).first())
        # Rung for its retry already: the periodic task leaves it unless this one is lost.
        WebhookDelivery.objects.filter(pk=delivery_id).update(rung_at=retry_at)
        dispatch.deliver_webhook(delivery_id, eta=retry_at)


@db_periodic_task(every_tick, priority=PERIODIC_PRIORITY)
def deliver_due_webhooks() -> None:
    """Ring again for deliveries whose attempt is due and whose doorbell was lost (each
    marked rung by whoever takes it: one pending doorbell per delivery)."""
    with presence.periodic("deliver_due_webhooks"):
        due = webhooks.due_to_ring()
        for delivery_id in due:
            dispatch.deliver_webhook(delivery_id)


@db_periodic_task(crontab(minute="17"), priority=PERIODIC_PRIORITY)
def prune_old_records() -> None:
    """Hourly: delete the records past their retention (TOLLGATE_KEEP_*_DAYS)."""
    with presence.periodic("prune_old_records"):
        pruned = retention.prune_records()
    if any(pruned.values()):
        log.info("pruned %s", pruned)


@task()
def chain_hop(remaining: int, token: str) -> None:
    """One hop of a raw Huey chain (no database work): the bench's queue reference."""
    if remaining > 1:
        chain_hop(remaining - 1, token)
    else:
        chain_hop.huey.put(token, "done")


@db_task()
def ping() -> str:
    """A no-op round trip through the queue: the floor the benchmarks measure against."""
    return "pong"


# The tasks dispatch rings (it never imports this module: this one is above it).
dispatch.bind(work=work, compensate_run=compensate_run, deliver_outbox=deliver_outbox,
              deliver_webhook=deliver_webhook, handle_chat_press=handle_chat_press)

"""Huey tasks: thin doorbells over the worker and sweeper functions."""

from __future__ import annotations

from django.conf import settings
from huey.consumer import Scheduler
from huey.contrib.djhuey import db_periodic_task, db_task

from . import sweeper, worker

# Huey looks at periodic tasks once a minute; the sweeper must run every
# TOLLGATE_SWEEP_SECONDS, and every periodic task here is safe to run that often.
Scheduler.periodic_task_seconds = settings.TOLLGATE_SWEEP_SECONDS


def every_tick(_now) -> bool:
    return True


@db_task()
def run_step(step_id: int) -> str:
    return worker.run_step(step_id)


@db_task()
def compensate_run(run_id: int) -> list[str]:
    return worker.compensate_run(run_id)


@db_periodic_task(every_tick)
def sweep() -> dict:
    report = sweeper.sweep()
    return {"expired": report.expired, "rerung": report.rerung}


@db_periodic_task(every_tick)
def start_scheduled_runs() -> dict:
    from . import schedules

    report = schedules.tick()
    return {"started": report.started, "skipped": report.skipped, "missed": report.missed}


@db_periodic_task(every_tick)
def apply_gate_deadlines() -> int:
    from . import deadlines

    return deadlines.apply()


@db_task()
def send_notifications(checkpoint_id: int, events: list) -> int:
    from . import notifications

    return notifications.deliver(checkpoint_id, [tuple(e) for e in events])


@db_task()
def ping() -> str:
    """A no-op round trip through the queue: the floor the benchmarks measure against."""
    return "pong"

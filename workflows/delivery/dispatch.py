"""Ringing the queue. A Huey message is only a doorbell: the step row says what to do.

The dispatcher listens to the engine's `transition_committed` signal (connected in
`WorkflowsConfig.ready`), so the engine never imports the queue.
"""

from __future__ import annotations

import logging

from django.conf import settings

from workflows.engine import Announcement
from workflows.timing import clock

log = logging.getLogger(__name__)


_tasks: dict = {}


def bind(**tasks) -> None:
    """The Huey tasks this module rings, given by `tasks.py` when it loads: the queue's
    module sits above this one, and this one never imports it."""
    _tasks.update(tasks)


def on_transition(sender, announcement: Announcement, **kwargs) -> None:
    """After a transition commits: wake workers for its newly ready steps, schedule its
    retries, start compensation of a run that just failed, and ring for its outbox (mail
    and webhooks, written in its transaction)."""
    if settings.TOLLGATE_DISPATCH:
        wake(len(announcement.ring), announcement.priority)
        for _, eta in announcement.retry:
            wake_at(eta, announcement.priority)
        if announcement.compensations:
            compensate(announcement.run_id)
    for message_id in announcement.outbox:
        deliver_outbox(message_id)


def _enqueue(what: str, task, *args, **kwargs) -> bool:
    """Put a task on the queue. The queue being down must not undo a committed transition:
    a failure is logged, saying what is lost and who makes up for it, and returns False."""
    try:
        task(*args, **kwargs)
        return True
    except Exception:
        log.exception("Could not enqueue %s", what)
        return False


def wake(count: int, priority: int = 1) -> None:
    """Ring up to `count` doorbells (at most TOLLGATE_WAKE_LIMIT): each wakes a worker,
    which claims the next step any run has for it and keeps going while there is work, so
    a doorbell names no step. A lost one is found again by the sweeper."""
    for _ in range(min(count, settings.TOLLGATE_WAKE_LIMIT)):
        if not _enqueue("a doorbell; the sweeper will ring again", _tasks["work"],
                        priority=priority):
            return


def wake_at(eta, priority: int = 1) -> None:
    """Ring a doorbell at `eta` (a scheduled retry, on the database's clock). Huey keeps a
    time on the clock of the consumer that schedules it, so it is given as a delay from
    now on the database's clock: a consumer whose clock is off still rings on time."""
    delay = max((eta - clock.now()).total_seconds(), 0.0)
    _enqueue(f"a doorbell for {eta}; the sweeper will ring again", _tasks["work"].schedule,
             delay=delay, priority=priority)


def compensate(run_id: int) -> None:
    _enqueue(f"compensation of run {run_id}; the sweeper will ring again",
             _tasks["compensate_run"], run_id)


def deliver_outbox(message_id: int) -> None:
    _enqueue(f"outbox message {message_id}; the periodic task will ring again",
             _tasks["deliver_outbox"], message_id)


def deliver_webhook(delivery_id: int, eta=None) -> None:
    task = _tasks["deliver_webhook"]
    what = f"webhook delivery {delivery_id}; the periodic task will post it"
    if eta:
        _enqueue(what, task.schedule, args=(delivery_id,), eta=eta)
    else:
        _enqueue(what, task, delivery_id)


def handle_chat_press(interaction_id: int) -> None:
    _enqueue(f"chat press {interaction_id}; the periodic task will handle it",
             _tasks["handle_chat_press"], interaction_id)

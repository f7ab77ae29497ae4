"""Who is working: each consumer process reports itself every TOLLGATE_SWEEP_SECONDS (a row
per process, with the leases it holds), and each periodic task records its last run. The
workers page, `GET /api/workers` and `/readyz` read them."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import F

from workflows.engine import processes
from workflows.models import PeriodicRun, Worker
from workflows.timing import clock
from workflows.workers.worker import KEEPER

log = logging.getLogger(__name__)

_started: dict[int, threading.Thread] = {}
_lock = threading.Lock()


def report(holds: list[str]) -> None:
    """Record this process as seen now, holding these leases."""
    me = processes.this_process()
    now = clock.now()
    updated = Worker.objects.filter(host=me.host[:200], boot_id=me.boot_id, pidns=me.pidns[:40],
                                    pid=me.pid, started=me.started).update(last_seen=now,
                                                                           holds=holds)
    if not updated:
        Worker.objects.get_or_create(
            host=me.host[:200], boot_id=me.boot_id, pidns=me.pidns[:40], pid=me.pid,
            started=me.started, defaults={"first_seen": now, "last_seen": now, "holds": holds})


def _beat() -> None:
    while True:
        try:
            with KEEPER.lock:
                holds = [f"{kind}:{pk}" for kind, pk in KEEPER.leases]
            report(holds)
        except DatabaseError:
            log.warning("Could not report this worker's presence; trying again", exc_info=True)
            connection.close()
        time.sleep(settings.TOLLGATE_SWEEP_SECONDS)


def start() -> None:
    """Start this process's presence thread (once per process)."""
    import os

    with _lock:
        thread = _started.get(os.getpid())
        if thread is None or not thread.is_alive():
            thread = threading.Thread(target=_beat, name="presence", daemon=True)
            thread.start()
            _started[os.getpid()] = thread


def state(worker: Worker, now=None) -> str:
    """alive, gone (its process is known to be gone) or silent (not seen for three periods:
    frozen, cut off, or on a machine that went away)."""
    now = now or clock.now()
    local = processes.holder_state(worker.host, worker.boot_id, worker.pid, worker.started,
                                   worker.pidns)
    if local == processes.GONE:
        return "gone"
    if worker.last_seen < now - timedelta(seconds=3 * settings.TOLLGATE_SWEEP_SECONDS):
        return "silent"
    return "alive"


@contextmanager
def periodic(name: str):
    """Record a periodic task's run: when it started and finished, how long it took, and
    the error if it failed."""
    began, started_at = time.monotonic(), clock.now()
    error = ""
    try:
        yield
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        try:
            seconds = time.monotonic() - began
            updated = PeriodicRun.objects.filter(name=name).update(
                last_started=started_at, last_finished=clock.now(), last_seconds=seconds,
                last_error=error, runs=F("runs") + 1)
            if not updated:
                PeriodicRun.objects.get_or_create(name=name, defaults={
                    "last_started": started_at, "last_finished": clock.now(),
                    "last_seconds": seconds, "last_error": error, "runs": 1})
        except DatabaseError:
            connection.close()


def sweeper_late(now=None) -> str:
    """A warning when no sweep has finished for three periods ("" when all is well)."""
    now = now or clock.now()
    last = PeriodicRun.objects.filter(name="sweep").values_list("last_finished",
                                                               flat=True).first()
    limit = timedelta(seconds=3 * settings.TOLLGATE_SWEEP_SECONDS)
    if last is None:
        return "No sweep has run yet: is a consumer (manage.py run_huey) running?"
    if last < now - limit:
        return (f"No sweep has run since {last:%Y-%m-%d %H:%M:%S} (more than three periods "
                f"of {settings.TOLLGATE_SWEEP_SECONDS:g}s): are the consumers running?")
    return ""

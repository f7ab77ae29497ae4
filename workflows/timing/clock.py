"""The database's clock, read cheaply: leases, deadlines, retries and schedules are times
that processes on many machines compare, so they are all on one clock, the database's.

Each process reads the database's time (one query, at most once a minute, halfway through
its round trip) and from then on counts forward from it on its own monotonic clock, which
an NTP step, a resumed VM or a hand-set date does not move. A worker 30 s behind or 60 s
ahead then takes, renews and judges leases as one on time would, and a wall clock that
jumps forward or back is noticed at the next reading (its wall time no longer agrees with
the monotonic count) and never believed: the database is read again at once. On SQLite
the database's clock is the machine's, so the process's own wall time is read instead, and
a jump of it is the machine's for every process alike.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

log = logging.getLogger(__name__)

CHECK_SECONDS = 60.0
JUMP = timedelta(seconds=2)  # wall and monotonic time parting by more is a clock step

_lock = threading.Lock()
_checked = -CHECK_SECONDS  # time.monotonic() of the last reading
_base: tuple[datetime, datetime, float] | None = None  # (database, wall, monotonic) then


def now() -> datetime:
    """The database's current time, as an aware datetime."""
    mono = time.monotonic()
    if _base is None or mono - _checked >= CHECK_SECONDS:
        _measure()
    elif abs(timezone.now() - (_base[1] + timedelta(seconds=mono - _base[2]))) > JUMP:
        _stepped()
    if _base is None:  # never read (the database away from the first call)
        return timezone.now()
    database, _, at = _base
    return database + timedelta(seconds=time.monotonic() - at)


def database_now() -> datetime:
    """The database's time, read from it now: for the decisions no process's clocks may
    sway, not even its monotonic one (a deadline passed, a reminder due, a lease run out).
    One query on PostgreSQL; on SQLite, the machine's time."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def defer_measuring() -> None:
    """Count the time as read just now, so that the next reading is a minute away. For work
    whose queries are counted (tests, the bench's pages): the reading's one query would
    otherwise land in whichever request crossed the minute. A process that never read the
    database's time starts from its own."""
    global _checked, _base
    with _lock:
        _checked = time.monotonic()
        if _base is None:
            wall = timezone.now()
            _base = (wall, wall, _checked)


def forget() -> None:
    """Drop the reading: the next call reads the time afresh. For a process that starts
    over (each test: one that moved the wall clock leaves no count behind for the next)."""
    global _checked, _base
    with _lock:
        _base, _checked = None, -CHECK_SECONDS


def _stepped() -> None:
    """The wall clock stepped since the last reading: not believed. PostgreSQL's time is
    read again at once; on SQLite (whose clock is the machine's) the count goes on from the
    monotonic clock until the minute's reading, so a step corrected within it is never
    seen, and one that stands is taken as the machine's new time then."""
    global _base
    log.warning("This process's wall clock stepped; the step is not believed")
    if connection.vendor == "postgresql" and _measure(force=True):
        return
    with _lock:
        if _base is not None:  # watch for the next step from the wall time as it is now
            database, _, at = _base
            _base = (database, timezone.now() - timedelta(seconds=time.monotonic() - at), at)


def _measure(force: bool = False) -> bool:
    global _base, _checked
    with _lock:
        if not force and _base is not None and time.monotonic() - _checked < CHECK_SECONDS:
            return True
        if connection.vendor != "postgresql":
            wall, mono = timezone.now(), time.monotonic()
            _base, _checked = (wall, wall, mono), mono
            return True
        try:
            with connection.cursor() as cursor:
                before, wall_before = time.monotonic(), timezone.now()
                cursor.execute("SELECT clock_timestamp()")
                theirs = cursor.fetchone()[0]
                after, wall_after = time.monotonic(), timezone.now()
        except DatabaseError:
            # Read again a second from now; the last reading goes on counting meanwhile.
            _checked = time.monotonic() - CHECK_SECONDS + 1.0
            return False
        middle = before + (after - before) / 2
        _base = (theirs, wall_before + (wall_after - wall_before) / 2, middle)
        _checked = middle
        return True

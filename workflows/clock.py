"""The database's clock, read cheaply: leases, deadlines, retries and schedules are times
that processes on many machines compare, so they are all on one clock, the database's.

Each process measures how far its own clock is from the database's (one query, at most
once a minute, halfway through its round trip) and adds that offset to its own time. A
worker 30 s behind or 60 s ahead then takes, renews and judges leases as one on time would.
On SQLite the database's clock is this process's, so the offset is zero.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

CHECK_SECONDS = 60.0

_lock = threading.Lock()
_offset = timedelta(0)
_checked = -CHECK_SECONDS  # time.monotonic() of the last measurement


def now() -> datetime:
    """The database's current time, as an aware datetime."""
    if time.monotonic() - _checked >= CHECK_SECONDS:
        _measure()
    return timezone.now() + _offset


def defer_measuring() -> None:
    """Count the offset as measured just now, so that the next measurement is a minute away.
    For work whose queries are counted (tests, the bench's pages): the measurement's one
    query would otherwise land in whichever request crossed the minute."""
    global _checked
    with _lock:
        _checked = time.monotonic()


def _measure() -> None:
    global _offset, _checked
    with _lock:
        if time.monotonic() - _checked < CHECK_SECONDS:
            return
        if connection.vendor != "postgresql":
            _offset, _checked = timedelta(0), time.monotonic()
            return
        try:
            with connection.cursor() as cursor:
                before = timezone.now()
                cursor.execute("SELECT clock_timestamp()")
                theirs = cursor.fetchone()[0]
                after = timezone.now()
        except DatabaseError:
            return  # measured again on the next call; the last offset stands meanwhile
        _offset = theirs - (before + (after - before) / 2)
        _checked = time.monotonic()

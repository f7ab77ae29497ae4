"""A clock tests move: the one Tollgate reads for every due time (`workflows.timing.clock`: leases,
deadlines, reminders, escalations, retries, schedules, digests), held still and moved by
hand. Move it forward: what the database stamps by itself (the outbox's due times) keeps
the machine's time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta


class MovedClock:
    """Tollgate's time within `moved_clock()`: `now()`, and `advance()` to move it."""

    def __init__(self, at: datetime):
        self.at = at

    def now(self) -> datetime:
        return self.at

    def advance(self, delta: timedelta | None = None, **parts: float) -> datetime:
        """Move the clock forward by `delta` (or timedelta's own keywords: hours=2)."""
        self.at += delta if delta is not None else timedelta(**parts)
        return self.at


@contextmanager
def moved_clock(start: datetime | None = None) -> Iterator[MovedClock]:
    """Tollgate's clock, still at `start` (now, by default) until moved, within the block."""
    from workflows.timing import clock

    moved = MovedClock(start or clock.now())
    saved = clock.now, clock.database_now
    clock.now = clock.database_now = moved.now
    try:
        yield moved
    finally:
        clock.now, clock.database_now = saved


def run_due() -> dict[str, int]:
    """What the periodic tasks would do now: deadlines applied, reminders sent, schedules'
    runs started and digests mailed; how many of each."""
    from workflows.delivery import digests
    from workflows.timing import clock, deadlines, schedules

    now = clock.now()
    return {"deadlines": deadlines.apply(now), "reminders": deadlines.remind(now),
            "schedules": len(schedules.tick(now).started),
            "digests": digests.send_digests(now)}

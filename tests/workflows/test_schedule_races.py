"""Two sweepers at once never start a slot twice (threads, real transactions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.models import Run, Schedule, ScheduleFire
from workflows.timing import schedules

from .test_concurrency import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_sweepers_start_each_slot_once(release_spec):
    t0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    items = [Schedule.objects.create(name=f"s{i}", spec_name="release", cron="",
                                     interval_seconds=60, next_run_at=t0, overlap="allow")
             for i in range(5)]
    for minute in range(3):
        now = t0 + timedelta(minutes=minute, seconds=5)
        results = race(4, lambda i, now=now: schedules.tick(now))
        assert not [r for r in results if isinstance(r, Exception)], results
        started = [run_id for r in results for run_id in r.started]
        assert len(started) == len(items) == len(set(started))
    assert Run.objects.count() == 15 and ScheduleFire.objects.count() == 15

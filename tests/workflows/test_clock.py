"""The database's clock: read by one query at most once a minute, counted on the monotonic
clock between readings, and never moved by a step of the wall clock."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from workflows.timing import clock

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="SQLite's clock is the process's own: nothing to measure")


@postgresql_only
@pytest.mark.django_db
def test_the_offset_is_measured_once_a_minute_and_a_deferred_measurement_waits(monkeypatch):
    monkeypatch.setattr(clock, "_checked", -clock.CHECK_SECONDS)  # a minute has passed
    with CaptureQueriesContext(connection) as first:
        clock.now()
        clock.now()
    assert [q["sql"] for q in first.captured_queries] == ["SELECT clock_timestamp()"]

    monkeypatch.setattr(clock, "_checked", -clock.CHECK_SECONDS)
    clock.defer_measuring()  # as the tests and the bench's page counts do
    with CaptureQueriesContext(connection) as deferred:
        clock.now()
    assert deferred.captured_queries == []


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("step", [217, -217])
def test_a_wall_clock_step_is_noticed_at_once_and_not_believed(monkeypatch, step):
    """An NTP step or a resumed VM moves this process's wall clock: the database's time,
    counted on the monotonic clock, does not move with it."""
    from datetime import timedelta

    from django.utils import timezone

    monkeypatch.setattr(clock, "_checked", -clock.CHECK_SECONDS)
    before = clock.now()
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=step))
    with CaptureQueriesContext(connection) as read:
        after = clock.now()
    assert abs((after - before).total_seconds()) < 1.0
    assert [q["sql"] for q in read.captured_queries] == ["SELECT clock_timestamp()"]
    assert abs((clock.now() - after).total_seconds()) < 1.0  # and stays so


@pytest.mark.parametrize("step", [217, -217])
def test_on_sqlite_a_step_is_believed_only_at_the_minutes_reading(monkeypatch, step):
    """SQLite's clock is the machine's: a step is not believed within the minute (one
    corrected by then is never seen), and is taken as the machine's time at the reading."""
    from datetime import timedelta

    from django.utils import timezone

    monkeypatch.setattr(clock.connection, "vendor", "sqlite")
    monkeypatch.setattr(clock, "_checked", -clock.CHECK_SECONDS)
    before = clock.now()
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=step))
    assert abs((clock.now() - before).total_seconds()) < 1.0
    monkeypatch.setattr(clock, "_checked", -clock.CHECK_SECONDS)  # a minute later
    assert abs((clock.now() - before).total_seconds() - step) < 1.0

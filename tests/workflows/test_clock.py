"""The database's clock: its offset measured by one query at most once a minute."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from workflows import clock

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="SQLite's clock is the process's own: nothing to measure")


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

"""Runs by the run that opened them (`parent`) and by the schedule that started them, in
the API, the runs page and `manage.py runs`; a filter that cannot be read is said so."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from workflows import engine
from workflows.models import ApiToken, Run, Schedule
from workflows.specs.storage import store_spec
from workflows.timing import schedules

from .test_children import CHILD, parent_spec, work_all

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def runs(people, release_spec):
    store_spec(CHILD)
    parent = engine.open_run(parent_spec(), actor=people["alice"],
                             params={"version": "1"}).run
    work_all()
    child = Run.objects.get(parent_step__run=parent)
    item = Schedule.objects.create(name="nightly", spec_name="release", cron="",
                                   interval_seconds=3600, next_run_at=T0)
    schedules.tick(T0 + timedelta(seconds=1))
    scheduled = Run.objects.get(idempotency_key__startswith="schedule:")
    engine.open_run(release_spec, actor=people["alice"])  # neither
    return {"parent": parent, "child": child, "schedule": item, "scheduled": scheduled}


def test_the_api_lists_runs_by_parent_and_by_schedule(client, people, runs):
    token = ApiToken.objects.issue(people["alice"], "t")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    found = client.get(f"/api/runs?parent={runs['parent'].pk}", **auth).json()
    assert [r["id"] for r in found["results"]] == [runs["child"].pk]
    found = client.get(f"/api/runs?schedule={runs['schedule'].pk}", **auth).json()
    assert [r["id"] for r in found["results"]] == [runs["scheduled"].pk]
    assert client.get("/api/runs?parent=abc", **auth).status_code == 400


def test_the_runs_page_filters_and_names_what_it_could_not_read(client, people, runs):
    client.force_login(people["alice"])
    body = client.get(f"/runs/?parent={runs['parent'].pk}").content.decode()
    assert f'href="/runs/{runs["child"].pk}/"' in body
    assert f'href="/runs/{runs["scheduled"].pk}/"' not in body
    assert "Runs opened by the steps of" in body
    body = client.get(f"/runs/?schedule={runs['schedule'].pk}").content.decode()
    assert f'href="/runs/{runs["scheduled"].pk}/"' in body
    assert f'href="/runs/{runs["child"].pk}/"' not in body
    body = client.get("/runs/?goal=abc&status=nonsense").content.decode()
    assert "goal &#x27;abc&#x27; is not a number" in body
    assert "status &#x27;nonsense&#x27; is not a run status" in body


def test_the_command_lists_runs_by_parent_and_by_schedule(runs):
    out = io.StringIO()
    call_command("runs", "--parent", str(runs["parent"].pk), stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()[1:]] == [
        str(runs["child"].pk)]
    out = io.StringIO()
    call_command("runs", "--schedule", str(runs["schedule"].pk), stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()[1:]] == [
        str(runs["scheduled"].pk)]

"""Runs and goals by latest activity (`sort=activity`): on the API, the runs page and the
command; a run that moves comes first, and so does a goal one of whose runs moved."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client

from goals.models import Goal
from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Run
from workflows.timing import clock

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(release_spec, people):
    """Runs opened a day apart (oldest first), none moved since."""
    runs = [engine.open_run(release_spec, actor=people["alice"], title=f"R{i}").run
            for i in range(3)]
    base = clock.now() - timedelta(days=10)
    for i, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=base + timedelta(days=i),
                                             updated_at=base + timedelta(days=i))
    return runs


def test_a_run_that_moves_comes_first_by_activity(api, three, people):
    oldest = three[0]
    work(oldest, "build")  # moves now
    ids = [r.pk for r in three]
    newest_first = [r["id"] for r in api["alice"].get("/api/runs").json()["results"]]
    assert newest_first == ids[::-1]
    by_activity = [r["id"] for r in api["alice"].get("/api/runs", sort="activity").json()
                   ["results"]]
    assert by_activity == [ids[0], ids[2], ids[1]]
    assert api["alice"].get("/api/runs", sort="bogus").status_code in (400, 422)

    out = io.StringIO()
    call_command("runs", "--sort", "activity", stdout=out)
    listed = [int(line.split()[0]) for line in out.getvalue().splitlines()[1:]]
    assert listed == by_activity

    page = Client()
    page.force_login(people["alice"])
    body = page.get("/runs/", {"sort": "activity"}).content.decode()
    shown = [body.index(f"/runs/{pk}/") for pk in by_activity]
    assert shown == sorted(shown)
    assert 'value="activity" selected' in body
    refused = page.get("/runs/", {"sort": "sideways"}).content.decode()
    assert "sort &#x27;sideways&#x27; is not a sort" in refused


def test_a_goal_whose_run_moved_comes_first_by_activity(api, release_spec, people):
    old, new = Goal.objects.create(title="Old"), Goal.objects.create(title="New")
    run = engine.open_run(release_spec, actor=people["alice"], goal=old).run
    long_ago = clock.now() - timedelta(days=30)
    Goal.objects.filter(pk=old.pk).update(updated_at=long_ago)
    Goal.objects.filter(pk=new.pk).update(updated_at=long_ago + timedelta(days=1))
    Run.objects.filter(pk=run.pk).update(updated_at=long_ago)
    titles = [g["title"] for g in api["alice"].get("/api/goals", sort="activity").json()]
    assert titles == ["New", "Old"]
    work(run, "build")
    titles = [g["title"] for g in api["alice"].get("/api/goals", sort="activity").json()]
    assert titles == ["Old", "New"]
    assert [g["title"] for g in api["alice"].get("/api/goals").json()] == ["New", "Old"]

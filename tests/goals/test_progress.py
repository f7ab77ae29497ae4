"""The progress report on known data, its pages, and query counts at 10,000 goals."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from goals import tree
from goals.models import Goal
from goals.progress import percentile, progress_report
from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Run, RunDay, Step
from workflows.timing import clock

pytestmark = pytest.mark.django_db


def test_percentile_interpolates_between_ranks():
    assert percentile([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 90) == pytest.approx(91.0)
    assert percentile([5], 90) == 5 and percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)


@pytest.fixture
def known(release_spec, people, monkeypatch):
    """A subtree with hand-countable runs, decisions and a blocked goal."""
    root = Goal.objects.create(title="Root")
    team = Goal.objects.create(title="Team", parent=root)
    Goal.objects.create(title="Stuck", parent=team, status="blocked", blocker_reason="legal")
    Goal.objects.create(title="Done", parent=root, status="completed")
    elsewhere = Goal.objects.create(title="Elsewhere")

    def run(goal):
        return engine.open_run(release_spec, actor=people["alice"], goal=goal).run

    # Two completed, one failed under the subtree; one failed elsewhere. The qa decisions
    # took 10, 20, 30 and 100 seconds: each made at a moment held still that long after
    # the gate was set waiting.
    waits = iter([10, 20, 30, 100])
    for _ in range(2):
        r = run(team)
        for key in ("build",):
            work(r, key)
        for name in ("bob", "carol"):
            at = clock.now()
            Step.objects.filter(run=r, key="qa").update(
                waiting_since=at - timedelta(seconds=next(waits)))
            with monkeypatch.context() as held:
                held.setattr(clock, "now", lambda at=at: at)
                engine.approve(r, "qa", user=people[name])
        for key in ("deploy", "notify"):
            work(r, key)
    work(run(team), "build", "failed")
    work(run(elsewhere), "build", "failed")
    waiting = run(root)
    work(waiting, "build")
    return root, waiting


def test_report_numbers_on_known_data(known):
    root, waiting = known
    report = progress_report(root)
    assert report.goals_by_status == {"active": 2, "blocked": 1, "completed": 1,
                                      "abandoned": 0, "cancelled": 0}
    assert sum(n for _, n in report.weeks) == 2 and report.weeks[-1][1] == 2
    assert [g.run_id for g in report.gates] == [waiting.pk]
    (qa,) = report.latencies
    # median of 10, 20, 30, 100 = 25; p90 = 30 + 0.7 * (100 - 30) = 79
    assert (qa.group, qa.decisions, qa.median, qa.p90) == ("qa", 4, 25, pytest.approx(79))
    (release,) = report.failures
    assert (release.finished, release.failed) == (3, 1) and release.rate == pytest.approx(1 / 3)
    assert [g.title for g in report.blocked] == ["Stuck"]


def test_everything_includes_other_trees(known):
    report = progress_report()
    assert report.failures[0].failed == 2 and report.goals_by_status["active"] == 3


def finish_completed_runs_at(when) -> None:
    """Move the completed runs' finish, and their day rows with it (as the engine would
    have written them)."""
    from datetime import UTC

    runs = Run.objects.filter(status="completed")
    RunDay.objects.filter(completed__gt=0).update(day=when.astimezone(UTC).date())
    runs.update(finished_at=when)


def test_old_completions_fall_outside_the_weeks(known):
    finish_completed_runs_at(timezone.now() - timedelta(weeks=20))
    assert sum(n for _, n in progress_report(known[0]).weeks) == 0


def test_weeks_and_failures_come_from_the_day_rows(known, tmp_path):
    """A run finishing writes its day row in its own transaction; the report reads those
    rows (folded or not), so a pruned run still counts on its day."""
    from goals.rollup import fold_days

    report = progress_report(known[0])
    assert sum(n for _, n in report.weeks) == 2 and report.failures[0].failed == 1
    fold_days()
    assert RunDay.objects.filter(folded=False).count() == 0
    folded = progress_report(known[0])
    assert folded.weeks == report.weeks and folded.failures == report.failures
    from workflows.ops.retention import prune_runs

    with open(tmp_path / "pruned.jsonl", "w") as out:  # pruned: the counts stay
        assert prune_runs(0, out, now=timezone.now() + timedelta(days=1)) == 4
    assert not Run.objects.filter(status="completed").exists()
    assert sum(n for _, n in progress_report(known[0]).weeks) == 2


def test_a_reopened_run_leaves_its_day(known, people):
    """A failed run retried out of its failure takes back its day's failure."""
    root, _ = known
    failed = Run.objects.get(status="failed", goal__title="Team")
    step = failed.steps.filter(status="failed").first()
    before = progress_report(root).failures[0].failed
    engine.retry_step(failed, step.key, actor=people["alice"])
    assert progress_report(root).failures[0].failed == before - 1


def test_weeks_are_the_viewers_weeks(known):
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    now = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)  # a Wednesday
    finish_completed_runs_at(datetime(2026, 3, 1, 23, 30, tzinfo=UTC))  # Monday 08:30 Tokyo
    with timezone.override(UTC):
        weeks = progress_report(known[0], now=now).weeks
        assert [n for _, n in weeks[-2:]] == [2, 0]
        assert weeks[-1][0] == datetime(2026, 3, 2, tzinfo=UTC)
    with timezone.override(ZoneInfo("Asia/Tokyo")):
        weeks = progress_report(known[0], now=now).weeks
        assert [n for _, n in weeks[-2:]] == [0, 2]
        assert weeks[-1][0] == datetime(2026, 3, 2, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert len(weeks) == 12


def test_page_and_csv(client, known, people):
    client.force_login(people["dave"])
    root = known[0]
    body = client.get(f"/goals/{root.pk}/progress/").content.decode()
    assert "<svg" in body and "Stuck" in body and "legal" in body and "25 s" in body
    response = client.get(f"/goals/{root.pk}/progress/?format=csv")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["section", "item", "measure", "value"]
    assert ["approval latency", "qa", "p90 seconds", "79.0"] in rows
    assert ["failure rate", "release", "failed runs", "1"] in rows
    assert client.get("/goals/progress/").status_code == 200


def count(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_query_counts_hold_at_ten_thousand_goals(client, people, release_spec):
    client.force_login(people["dave"])
    root = Goal.objects.create(title="Company", owner=people["alice"])
    Goal.objects.create(title="Seed", parent=root, status="blocked", blocker_reason="x")
    run = engine.open_run(release_spec, goal=root).run
    work(run, "build")
    urls = ["/goals/", f"/goals/{root.pk}/", f"/goals/{root.pk}/children/",
            "/goals/progress/", f"/goals/{root.pk}/progress/"]
    small = [count(client, url) for url in urls]
    teams = Goal.objects.bulk_create(Goal(title=f"Team {i}", parent=root) for i in range(100))
    Goal.objects.bulk_create(
        Goal(title=f"Goal {t.pk}.{j}", parent=t, status="blocked" if j % 10 == 0 else "active",
             blocker_reason="waiting" if j % 10 == 0 else "")
        for t in teams for j in range(99))
    tree.relink_all()  # written in bulk, without Goal.save
    assert Goal.objects.count() >= 10_000
    assert [count(client, url) for url in urls] == small

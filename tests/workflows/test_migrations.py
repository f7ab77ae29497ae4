"""Upgrading a database that already holds runs."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("workflows", "0003_deadlines_and_notifications")


@contextmanager
def old_models(target, *also):
    """The models as they were at a migration (and `also`, other apps' states), with the
    database migrated back to it; forward to the latest again on the way out."""
    call_command("migrate", *target, verbosity=0)
    try:
        yield MigrationExecutor(connection).loader.project_state([target, *also]).apps
    finally:
        call_command("migrate", verbosity=0)


def old_spec(apps, name: str):
    """An empty spec in the models as they were, for old runs to belong to."""
    return apps.get_model("workflows", "WorkflowSpec").objects.create(
        name=name, version=1, definition={"steps": []})


@pytest.mark.django_db(transaction=True)
def test_existing_steps_get_their_dependents_and_unsettled_counts():
    with old_models(BEFORE) as apps:
        spec = old_spec(apps, "upgrade")
        run = apps.get_model("workflows", "Run").objects.create(
            spec=spec, spec_name="upgrade", title="upgrade")
        old_step = apps.get_model("workflows", "Step")
        for index, (key, deps, status, cof) in enumerate([
            ("build", [], "completed", False),
            ("lint", [], "failed", True),  # a failure that does not hold dependants back
            ("test", ["build", "lint"], "pending", False),
            ("ship", ["test", "build"], "pending", False),
        ]):
            old_step.objects.create(run=run, key=key, index=index, depends_on=deps, kind="run",
                                    status=status, continue_on_failure=cof)
    from workflows.models import Step

    edges = {s.key: (s.dependents, s.waiting_on) for s in Step.objects.filter(run_id=run.pk)}
    assert edges == {"build": (["test", "ship"], 0), "lint": (["test"], 0),
                     "test": (["ship"], 0), "ship": ([], 1)}


@pytest.mark.django_db(transaction=True)
def test_existing_runs_get_their_step_counts():
    before = ("workflows", "0027_run_search_text")
    with old_models(before) as apps:
        spec = old_spec(apps, "counted")
        run = apps.get_model("workflows", "Run").objects.create(
            spec=spec, spec_name="counted", title="counted")
        old_step = apps.get_model("workflows", "Step")
        for index, status in enumerate(["completed", "skipped", "compensated", "failed",
                                        "pending"]):
            old_step.objects.create(run=run, key=f"s{index}", index=index, kind="run",
                                    status=status)
    from workflows.models import Run

    assert Run.objects.filter(pk=run.pk).values_list("steps_total", "steps_done").get() == (5, 2)


@pytest.mark.django_db(transaction=True)
def test_goals_keep_their_finished_and_pruned_counts_in_one_tally():
    before = ("workflows", "0028_run_step_counts")
    with old_models(before, ("goals", "0002_pruned_counters")) as apps:
        goal = apps.get_model("goals", "Goal").objects.create(
            title="counted", pruned_runs_completed=2, pruned_runs_failed=1,
            pruned_steps_total=9, pruned_steps_done=7)
        idle = apps.get_model("goals", "Goal").objects.create(title="idle")
        spec = old_spec(apps, "counted")
        old_run = apps.get_model("workflows", "Run")
        for status, total, done in [("completed", 3, 3), ("failed", 3, 1),
                                    ("cancelled", 3, 0), ("running", 3, 2)]:
            old_run.objects.create(spec=spec, spec_name="counted", title=status, goal=goal,
                                   status=status, steps_total=total, steps_done=done)
    from goals.rollup import rollup
    from workflows.models import GoalTally

    assert list(GoalTally.objects.values_list(
        "goal_id", "folded", "runs_completed", "runs_failed", "steps_total", "steps_done")) == [
        (goal.pk, True, 3, 2, 15, 11)]
    counted = rollup(goal.pk)
    assert (counted.runs_open, counted.runs_completed, counted.runs_failed,
            counted.steps_total, counted.steps_done) == (1, 3, 2, 18, 13)
    assert rollup(idle.pk).runs_completed == 0


@pytest.mark.django_db(transaction=True)
def test_existing_runs_of_a_schedule_know_it_retries_included():
    before = ("workflows", "0059_a_person_who_acted_stays")
    with old_models(before) as apps:
        spec = old_spec(apps, "nightly")
        schedule = apps.get_model("workflows", "Schedule").objects.create(
            name="nightly", spec_name="nightly", interval_seconds=3600)
        old_run = apps.get_model("workflows", "Run")
        slot = f"schedule:{schedule.pk}:2026-12-01T02:00:00+00:00"
        runs = [old_run.objects.create(spec=spec, spec_name="nightly", title=key,
                                       idempotency_key=key).pk
                for key in (slot, f"{slot}:retry-1", "nightly-by-hand")]
    from workflows.models import Run

    assert list(Run.objects.filter(pk__in=runs).order_by("pk").values_list(
        "schedule_id", flat=True)) == [schedule.pk, schedule.pk, None]

"""Closing a goal while runs under it are open: refused unless its runs are cancelled, by one
rule in the goal services, from the API, the admin form and the admin's bulk actions."""

import pytest

from goals.models import Goal
from goals.services import OpenRuns, goal_set_status
from workflows import engine
from workflows.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def goal_with_runs(release_spec, people):
    goal = Goal.objects.create(title="Ship 3", owner=people["alice"])
    runs = [engine.open_run(release_spec, actor=people["alice"], goal=goal).run
            for _ in range(2)]
    done = engine.open_run(release_spec, actor=people["alice"], goal=goal).run
    engine.cancel_run(done, actor=people["alice"])
    return goal, runs


def test_the_service_refuses_then_cancels_when_asked(goal_with_runs, people):
    from django.contrib.auth.models import Permission

    goal, runs = goal_with_runs
    people["alice"].user_permissions.add(Permission.objects.get(codename="change_goal"))
    alice = type(people["alice"]).objects.get(pk=people["alice"].pk)  # fresh permissions
    with pytest.raises(OpenRuns, match=rf"2 open runs \(#{runs[0].pk}, #{runs[1].pk}\)"):
        goal_set_status(goal, "completed")
    goal.refresh_from_db()
    assert goal.status == "active"
    goal_set_status(goal, "completed", open_runs="cancel", actor=alice)
    goal.refresh_from_db()
    assert goal.status == "completed"
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list(
        "status", flat=True)) == {"cancelled"}
    assert Run.objects.get(pk=runs[0].pk).error == f"Goal {goal.pk} (Ship 3) was closed"


def test_cancelling_needs_the_operator_right_and_changes_nothing_without_it(goal_with_runs,
                                                                           people):
    from django.contrib.auth.models import Permission
    from django.core.exceptions import PermissionDenied

    goal, runs = goal_with_runs
    people["bob"].user_permissions.add(Permission.objects.get(codename="change_goal"))
    bob = type(people["bob"]).objects.get(pk=people["bob"].pk)
    with pytest.raises(PermissionDenied):
        goal_set_status(goal, "completed", open_runs="cancel", actor=bob)
    goal.refresh_from_db()
    assert goal.status == "active"
    assert not Run.objects.filter(pk__in=[r.pk for r in runs], status="cancelled").exists()


def test_the_api_answers_409_naming_the_runs(goal_with_runs, people):
    from django.contrib.auth.models import Permission

    from tests.api.conftest import Api

    goal, runs = goal_with_runs
    people["alice"].user_permissions.add(Permission.objects.get(codename="change_goal"))
    response = Api(people["alice"]).patch(f"/api/goals/{goal.pk}", {"status": "completed"})
    assert response.status_code == 409
    assert f"#{runs[0].pk}" in response.json()["error"]
    assert Goal.objects.get(pk=goal.pk).status == "active"


def test_the_admin_form_asks_what_to_do_with_the_runs(goal_with_runs, admin_client):
    goal, runs = goal_with_runs
    form = {"title": "Ship 3", "status": "completed", "priority": "normal",
            "owner": goal.owner_id, "shared_state": "{}", "opened_at_0": "2026-01-01",
            "opened_at_1": "00:00:00", "children-TOTAL_FORMS": "0",
            "children-INITIAL_FORMS": "0"}
    response = admin_client.post(f"/admin/goals/goal/{goal.pk}/change/",
                                 {**form, "open_runs": "refuse"})
    assert response.status_code == 200 and "cancel them to close it" in response.content.decode()
    assert Goal.objects.get(pk=goal.pk).status == "active"
    response = admin_client.post(f"/admin/goals/goal/{goal.pk}/change/",
                                 {**form, "open_runs": "cancel"})
    assert response.status_code == 302
    assert Goal.objects.get(pk=goal.pk).status == "completed"
    assert not Run.objects.filter(goal=goal, status="open").exists()


def test_the_admin_bulk_actions_refuse_or_cancel(goal_with_runs, admin_client):
    goal, runs = goal_with_runs
    response = admin_client.post("/admin/goals/goal/", {
        "action": "mark_completed", "_selected_action": [goal.pk]}, follow=True)
    assert "open runs" in response.content.decode()
    assert Goal.objects.get(pk=goal.pk).status == "active"
    admin_client.post("/admin/goals/goal/", {"action": "complete_and_cancel_runs",
                                             "_selected_action": [goal.pk]})
    assert Goal.objects.get(pk=goal.pk).status == "completed"

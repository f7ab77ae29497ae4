"""A gate is passed only by its approvers: no skip, no back door through other entry points."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from goals.models import Goal
from workflows import engine
from workflows.models import ApiToken, Checkpoint

from ..conftest import make_user

pytestmark = pytest.mark.django_db


def gate_status(run) -> str:
    return run.steps.get(key="qa").status


class TestSkipNeverPassesAGate:
    def test_engine_refuses_whoever_asks(self, waiting, people):
        for actor in (people["alice"], None, "manage.py"):
            with pytest.raises(engine.IllegalTransition, match="never skipped"):
                engine.skip_step(waiting, "qa", actor=actor, reason="in a hurry")
        assert gate_status(waiting) == "waiting_approval"

    def test_superuser_cannot_skip_either(self, waiting):
        root = make_user("root", is_superuser=True, is_staff=True)
        with pytest.raises(engine.IllegalTransition, match="never skipped"):
            engine.skip_step(waiting, "qa", actor=root, reason="I am root")

    def test_web_post_by_operator_requester_is_refused(self, client, waiting, people):
        seq = Checkpoint.objects.filter(run=waiting).count()
        client.force_login(people["alice"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/skip/", {"comment": "go"})
        assert response.status_code == 409
        assert gate_status(waiting) == "waiting_approval"
        assert Checkpoint.objects.filter(run=waiting).count() == seq

    def test_api_skip_of_a_gate_answers_409(self, waiting, people):
        token = ApiToken.objects.issue(people["alice"])[1]
        api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        response = api.post(f"/api/runs/{waiting.pk}/steps/qa/skip", {"reason": "go"},
                            content_type="application/json")
        assert response.status_code == 409 and "never skipped" in response.json()["error"]
        assert gate_status(waiting) == "waiting_approval"

    def test_work_step_skip_needs_the_operator_permission(self, release_spec, people):
        run = engine.open_run(release_spec, actor=people["alice"]).run
        with pytest.raises(engine.NotPermitted, match="operator permission"):
            engine.skip_step(run, "build", actor=people["bob"], reason="no")
        engine.skip_step(run, "build", actor=people["alice"], reason="prebuilt")
        assert run.steps.get(key="build").status == "skipped"


class TestOperateIsCheckedByTheEngine:
    def test_cancel_and_retry_refuse_a_person_without_the_permission(self, waiting, people):
        with pytest.raises(engine.NotPermitted):
            engine.cancel_run(waiting, actor=people["bob"])
        engine.reject(waiting, "qa", user=people["bob"], comment="broken")
        with pytest.raises(engine.NotPermitted):
            engine.retry_step(waiting, "qa", actor=people["erin"])
        waiting.refresh_from_db()
        assert waiting.status == "failed"

    def test_the_system_may_cancel(self, waiting):
        engine.cancel_run(waiting, actor="schedule", reason="superseded")
        waiting.refresh_from_db()
        assert waiting.status == "cancelled"


class TestAdminActionsDeclarePermissions:
    @pytest.fixture
    def viewer(self, db):
        user = make_user("viewer", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(
            codename__in=["view_run", "view_goal", "view_workflowspec"]))
        client = Client()
        client.force_login(user)
        return client

    def test_view_only_staff_cannot_cancel_runs(self, viewer, waiting):
        response = viewer.post("/admin/workflows/run/", {
            "action": "cancel_runs", "_selected_action": [waiting.pk]})
        assert response.status_code in (200, 302, 403)
        waiting.refresh_from_db()
        assert waiting.status == "waiting_approval"
        page = viewer.get("/admin/workflows/run/").content.decode()
        assert "cancel_runs" not in page

    def test_view_only_staff_cannot_close_goals(self, viewer):
        goal = Goal.objects.create(title="Ship it")
        viewer.post("/admin/goals/goal/", {"action": "mark_completed",
                                           "_selected_action": [goal.pk]})
        goal.refresh_from_db()
        assert goal.status == "active"

    def test_operator_staff_can_cancel_from_the_admin(self, waiting):
        user = make_user("ops", is_staff=True, perms=("view_run", "operate_run"))
        client = Client()
        client.force_login(user)
        client.post("/admin/workflows/run/", {"action": "cancel_runs",
                                              "_selected_action": [waiting.pk]})
        waiting.refresh_from_db()
        assert waiting.status == "cancelled"

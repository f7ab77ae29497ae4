import pytest

from goals.models import Goal

pytestmark = pytest.mark.django_db


def test_admin_refuses_a_cycle(admin_client):
    root = Goal.objects.create(title="Root")
    child = Goal.objects.create(title="Child", parent=root)
    response = admin_client.post(f"/admin/goals/goal/{root.pk}/change/", {
        "title": "Root", "parent": child.pk, "status": "active", "priority": "normal",
        "shared_state": "{}", "opened_at_0": "2026-01-01", "opened_at_1": "00:00:00",
        "children-TOTAL_FORMS": "0", "children-INITIAL_FORMS": "0",
    })
    assert response.status_code == 200
    assert "cannot be its own ancestor" in response.content.decode()
    root.refresh_from_db()
    assert root.parent is None


def test_admin_bulk_close_goes_through_rules(admin_client):
    goal = Goal.objects.create(title="G")
    admin_client.post("/admin/goals/goal/", {"action": "mark_completed",
                                             "_selected_action": [goal.pk]})
    goal.refresh_from_db()
    assert goal.status == "completed" and goal.closed_at is not None


def test_admin_pages_render(admin_client, release_spec):
    Goal.objects.create(title="G")
    for url in ["/admin/goals/goal/", "/admin/goals/goal/add/", "/admin/workflows/run/",
                "/admin/workflows/workflowspec/",
                f"/admin/workflows/workflowspec/{release_spec.pk}/change/",
                "/admin/workflows/workflowspec/add/"]:
        assert admin_client.get(url).status_code == 200, url


def test_admin_spec_add_validates_with_engine_errors(admin_client):
    from workflows.models import WorkflowSpec

    response = admin_client.post("/admin/workflows/workflowspec/add/", {
        "name": "bad", "definition": '{"steps": [{"key": "a", "run": {"command": "ls"}}]}'})
    assert "command must be a list of arguments" in response.content.decode()
    assert not WorkflowSpec.objects.exists()
    response = admin_client.post("/admin/workflows/workflowspec/add/", {
        "name": "good", "definition": '{"steps": [{"key": "a", "run": {"command": ["ls"]}}]}'})
    assert response.status_code == 302
    assert WorkflowSpec.objects.get().version == 1


def test_admin_spec_change_saves_a_new_version_and_lists_every_problem(admin_client,
                                                                       release_spec):
    import json

    from workflows.models import WorkflowSpec

    url = f"/admin/workflows/workflowspec/{release_spec.pk}/change/"
    assert 'name="definition"' in admin_client.get(url).content.decode()
    broken = {"steps": [{"key": "a", "run": {"command": "make"}},
                        {"key": "b", "approval": {"required": 0}}]}
    body = admin_client.post(url, {"definition": json.dumps(broken)}).content.decode()
    assert "command must be a list" in body and "step &#x27;b&#x27; approval" in body
    assert WorkflowSpec.objects.filter(name="release").count() == 1
    changed = {**release_spec.definition, "description": "Build, sign off, deploy (v2)"}
    response = admin_client.post(url, {"definition": json.dumps(changed)})
    assert response.status_code == 302
    assert WorkflowSpec.objects.get(name="release", status="active").version == 2
    assert WorkflowSpec.objects.get(pk=release_spec.pk).status == "archived"


def test_admin_spec_page_is_read_only_without_change_rights(client, release_spec, people):
    from django.contrib.auth.models import Permission

    viewer = people["dave"]
    viewer.is_staff = True
    viewer.save()
    viewer.user_permissions.add(Permission.objects.get(codename="view_workflowspec"))
    client.force_login(viewer)
    body = client.get(f"/admin/workflows/workflowspec/{release_spec.pk}/change/").content.decode()
    assert 'name="definition"' not in body and 'name="_save"' not in body


def test_admin_spec_add_takes_the_definitions_own_name(admin_client):
    from workflows.models import WorkflowSpec

    steps = '"steps": [{"key": "a", "run": {"command": ["ls"]}}]'
    response = admin_client.post("/admin/workflows/workflowspec/add/", {
        "name": "", "definition": '{"name": "from-json", ' + steps + "}"})
    assert response.status_code == 302
    assert WorkflowSpec.objects.get().name == "from-json"
    refused = admin_client.post("/admin/workflows/workflowspec/add/", {
        "name": "other", "definition": '{"name": "from-json-2", ' + steps + "}"})
    assert "leave Name empty" in refused.content.decode()
    nameless = admin_client.post("/admin/workflows/workflowspec/add/", {
        "name": "", "definition": "{" + steps + "}"})
    assert "The definition needs its name" in nameless.content.decode()
    assert WorkflowSpec.objects.count() == 1

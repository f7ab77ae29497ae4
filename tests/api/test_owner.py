"""A run opened on someone's behalf (`owner`): only with the permission that says so, recorded
as opened by one person for another, the owner its requester under four-eyes."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client

from workflows import engine
from workflows.models import Checkpoint, Run

pytestmark = pytest.mark.django_db


def allow(user):
    user.user_permissions.add(Permission.objects.get(codename="open_run_for_others"))


def test_opening_for_someone_else_needs_its_own_permission(api, release_spec, people):
    refused = api["alice"].post("/api/runs", {"spec": "release", "owner": "bob"})
    assert refused.status_code == 403 and "for someone else" in refused.json()["error"]
    assert not Run.objects.exists()
    allow(people["alice"])
    opened = api["alice"].post("/api/runs", {"spec": "release", "owner": "bob",
                                             "idempotency_key": "for-bob"})
    assert opened.status_code == 201, opened.json()
    run = opened.json()
    assert (run["requested_by"], run["opened_by"]) == ("bob", "alice")
    first = Checkpoint.objects.get(run_id=run["id"], seq=1)
    assert first.actor_name == "alice" and "run for bob" in first.summary
    assert first.evidence["opened_for"] == "bob"
    # The key is bob's run's: alice sending it again, or bob himself, finds that run.
    again = api["alice"].post("/api/runs", {"spec": "release", "owner": "bob",
                                            "idempotency_key": "for-bob"})
    assert again.status_code == 200 and again.json()["id"] == run["id"]
    assert api["bob"].post("/api/runs", {"spec": "release", "idempotency_key": "for-bob"}
                           ).json()["id"] == run["id"]


def test_the_owner_is_the_requester_under_four_eyes(api, release_spec, people):
    allow(people["alice"])
    run_id = api["alice"].post("/api/runs", {"spec": "release", "owner": "bob"}).json()["id"]
    run = Run.objects.get(pk=run_id)
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    refused = api["bob"].post(f"/api/runs/{run_id}/steps/qa/approve", {})
    assert refused.status_code == 403
    assert api["carol"].post(f"/api/runs/{run_id}/steps/qa/approve", {}).status_code == 200
    page = Client()
    page.force_login(people["carol"])
    body = page.get(f"/runs/{run_id}/").content.decode()
    assert "requested by bob (opened for them by alice)" in body


@pytest.mark.parametrize("owner, says", [("nobody", "no such user"), ("erin", "disabled")])
def test_an_owner_who_cannot_be_one_is_refused(api, release_spec, people, owner, says):
    allow(people["alice"])
    people["erin"].is_active = False
    people["erin"].save()
    refused = api["alice"].post("/api/runs", {"spec": "release", "owner": owner})
    assert refused.status_code == 400 and says in refused.json()["error"]
    assert not Run.objects.exists()


def test_opening_for_oneself_is_an_ordinary_run(api, release_spec):
    run = api["alice"].post("/api/runs", {"spec": "release", "owner": "alice"}).json()
    assert (run["requested_by"], run["opened_by"]) == ("alice", None)


def test_the_command_opens_a_run_for_someone(release_spec, people):
    out = io.StringIO()
    call_command("start_run", "release", "--owner", "bob", stdout=out)
    run = Run.objects.get(pk=int(out.getvalue()))
    assert run.requested_by == people["bob"] and run.opened_by is None

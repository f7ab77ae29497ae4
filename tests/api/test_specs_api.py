"""Specs through the API and the command line, and the spec checks that used to slip."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.utils import timezone

from workflows import engine
from workflows.models import Schedule, WorkflowSpec
from workflows.models.schedules import ScheduleError, validate_schedule
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec
from workflows.timing import schedules

from ..conftest import RELEASE

pytestmark = pytest.mark.django_db


def test_list_and_read_specs(api, release_spec):
    store_spec({**RELEASE, "description": "v2"})
    engine.open_run("release")
    listed = api["dave"].get("/api/specs").json()
    assert listed == [{"name": "release", "version": 2, "status": "active", "description": "v2",
                       "versions": 2, "runs": 1}]
    archived = api["dave"].get("/api/specs", status="archived").json()
    assert [(s["name"], s["version"]) for s in archived] == [("release", 1)]
    every = api["dave"].get("/api/specs", status="any", limit=1).json()
    assert [(s["version"], s["status"]) for s in every] == [(2, "active")]
    assert api["dave"].get("/api/specs", status="lost").status_code == 400
    detail = api["dave"].get("/api/specs/release").json()
    assert detail["active_version"] == 2
    assert [(v["version"], v["status"], v["runs"]) for v in detail["versions"]] == [
        (2, "active", 1), (1, "archived", 0)]
    assert api["dave"].get("/api/specs/nope").status_code == 404


def test_archive_and_reactivate_need_the_change_permission(api, people, release_spec):
    store_spec({**RELEASE, "description": "v2"})
    refused = api["alice"].post("/api/specs/release/activate", {"version": 1})
    assert refused.status_code == 403
    from django.contrib.auth.models import Permission

    from workflows.models import SpecOwner

    change = Permission.objects.get(codename="change_workflowspec")
    people["alice"].user_permissions.add(change)
    # Which version runs is the name's owner's to say: the system loaded it, so the admins'.
    refused = api["alice"].post("/api/specs/release/activate", {"version": 1})
    assert refused.status_code == 403 and "belongs to the admins" in refused.json()["error"]
    SpecOwner.objects.create(name="release", user=people["alice"])  # an admin gives it her
    back = api["alice"].post("/api/specs/release/activate", {"version": 1})
    assert back.status_code == 200 and back.json()["active_version"] == 1
    people["bob"].user_permissions.add(change)  # may change specs, but not alice's
    refused = api["bob"].post("/api/specs/release/archive", {"version": 1})
    assert refused.status_code == 403 and "belongs to alice" in refused.json()["error"]
    gone = api["alice"].post("/api/specs/release/archive", {"version": 1}).json()
    assert gone["active_version"] is None
    assert api["alice"].post("/api/specs/release/archive", {"version": 9}).status_code == 404


def test_specs_command(release_spec):
    store_spec({**RELEASE, "description": "v2"})
    out = io.StringIO()
    call_command("specs", stdout=out)
    assert "release" in out.getvalue() and "v2" in out.getvalue() and "v1 " not in out.getvalue()
    out = io.StringIO()
    call_command("specs", "--status", "archived", "--limit", "5", stdout=out)
    assert "v1 " in out.getvalue() and "archived" in out.getvalue()


def test_a_program_name_with_spaces_is_refused():
    with pytest.raises(SpecError, match="use shell or split the arguments"):
        validate_spec({"name": "x", "steps": [
            {"key": "a", "run": {"command": ["echo hello world"]}}]})


def test_a_declared_version_must_be_the_next_one(db):
    store_spec({**RELEASE, "version": 1})
    with pytest.raises(SpecError, match="version 7 is not the next one; expected 2"):
        store_spec({**RELEASE, "version": 7, "description": "changed"})
    assert store_spec({**RELEASE, "version": 2, "description": "changed"})[0].version == 2
    assert WorkflowSpec.objects.filter(name="release").count() == 2


def test_a_schedule_needs_an_existing_spec(release_spec):
    with pytest.raises(ScheduleError, match="No spec named 'ghost'"):
        validate_schedule(Schedule(name="s", spec_name="ghost", interval_seconds=60))
    validate_schedule(Schedule(name="s", spec_name="release", interval_seconds=60))


def test_a_schedule_of_an_archived_spec_pauses_with_a_reason(release_spec):
    item = Schedule.objects.create(name="nightly", spec_name="release", interval_seconds=60,
                                   next_run_at=timezone.now())
    WorkflowSpec.objects.filter(name="release").update(status="archived")
    report = schedules.tick()
    item.refresh_from_db()
    assert report.started == [] and not item.enabled
    assert "has no active version" in item.paused_reason


def test_a_runs_audit_downloads_as_json_and_csv_from_the_api(api, waiting, people):
    engine.approve(waiting, "qa", user=people["bob"], comment="+1 from me")
    data = api["dave"].get(f"/api/runs/{waiting.pk}/audit").json()
    assert data["decisions"][0]["comment"] == "+1 from me"
    response = api["dave"].get(f"/api/runs/{waiting.pk}/audit.csv")
    body = b"".join(response.streaming_content).decode()
    assert response["Content-Type"] == "text/csv" and "'+1 from me" in body
    assert api["dave"].get("/api/runs/999999/audit.csv").status_code == 404


def test_one_broken_deadline_does_not_hold_the_others(release_spec, monkeypatch):
    from datetime import timedelta

    from workflows.models import Step
    from workflows.timing import deadlines

    spec = store_spec({"name": "timed", "steps": [
        {"key": "g", "approval": {"group": "qa", "timeout_seconds": 60}}]})[0]
    runs = [engine.open_run(spec).run for _ in range(2)]
    Step.objects.filter(key="g").update(deadline_at=timezone.now() - timedelta(seconds=1))
    bad = Step.objects.get(run=runs[0], key="g").pk
    real = engine.expire_gate
    monkeypatch.setattr(engine, "expire_gate",
                        lambda step_id: (_ for _ in ()).throw(OverflowError("bad row"))
                        if step_id == bad else real(step_id))
    assert deadlines.apply() == 1
    assert Step.objects.get(run=runs[1], key="g").status == "failed"

"""Run parameters and the Start page: typed values from every entry point, errors that name
the parameter, and the form that works without JavaScript."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from workflows import engine
from workflows.models import ApiToken, Run
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec

pytestmark = pytest.mark.django_db

PARAMS = [
    {"name": "version", "type": "string", "required": True, "description": "what to ship"},
    {"name": "rollout", "type": "choice", "options": ["canary", "full"], "default": "canary"},
    {"name": "replicas", "type": "number", "default": 2},
    {"name": "dry_run", "type": "boolean", "default": False},
    {"name": "notes", "type": "text"},
]


@pytest.fixture
def deploy(db):
    return store_spec({"name": "deploy", "description": "Ship a version", "params": PARAMS,
                       "steps": [{"key": "go", "run": {"command": ["env"]}}]})[0]


def test_params_are_validated_and_stored(deploy):
    run = engine.open_run(deploy, params={"version": "1.2", "replicas": "3"}).run
    assert run.params == {"version": "1.2", "rollout": "canary", "replicas": 3,
                          "dry_run": False}
    with pytest.raises(engine.InvalidInput) as refused:
        engine.open_run(deploy, params={"rollout": "everywhere", "extra": 1})
    message = str(refused.value)
    assert "Version is required (parameter 'version')" in message
    assert "Rollout must be one of canary, full, got 'everywhere' (parameter 'rollout')" in (
        message)
    assert "extra is not declared by the spec (parameter 'extra')" in message
    assert Run.objects.count() == 1


def test_declarations_are_checked_when_the_spec_loads():
    with pytest.raises(SpecError, match="a choice needs options"):
        validate_spec({"name": "x", "params": [{"name": "a", "type": "choice"}],
                       "steps": [{"key": "s", "run": {"command": ["true"]}}]})
    with pytest.raises(SpecError, match="default must be a number"):
        validate_spec({"name": "x", "params": [{"name": "n", "type": "number",
                                                "default": "many"}],
                       "steps": [{"key": "s", "run": {"command": ["true"]}}]})


def test_commands_see_params_in_their_environment_and_state_file(deploy):
    from workflows.workers.executors import execute

    outcome = execute({"shell": 'echo "$TOLLGATE_PARAM_VERSION $TOLLGATE_PARAM_DRY_RUN"; '
                                'cat "$TOLLGATE_STATE_FILE"'},
                      context={"run_id": 1, "step_key": "go", "attempt": 1,
                               "params": {"version": "1.2", "dry_run": False}},
                      shared_state={"branch": "main"},
                      stop=threading.Event())
    first, state = outcome.evidence["stdout"].split("\n", 1)
    assert first == "1.2 false"
    assert json.loads(state) == {"branch": "main", "params": {"version": "1.2",
                                                              "dry_run": False},
                                 "tollgate": {"fencing_scope": "run/1/step/go",
                                              "fencing_token": 1}}


def test_api_and_command_take_params(deploy, people):
    token = ApiToken.objects.issue(people["alice"])[1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    made = api.post("/api/runs", {"spec": "deploy", "params": {"version": "2.0"}},
                    content_type="application/json")
    assert made.status_code == 201 and made.json()["params"]["version"] == "2.0"
    bad = api.post("/api/runs", {"spec": "deploy", "params": {"replicas": "x"}},
                   content_type="application/json")
    assert bad.status_code == 400
    assert "Replicas must be a number, got 'x' (parameter 'replicas')" in bad.json()["error"]
    out = io.StringIO()
    call_command("start_run", "deploy", "--param", "version=3.0", "--param", "dry_run=yes",
                 stdout=out)
    assert Run.objects.get(pk=int(out.getvalue())).params["dry_run"] is True
    with pytest.raises(CommandError, match=r"Version is required \(parameter 'version'\)"):
        call_command("start_run", "deploy", stdout=io.StringIO())


class TestStartPage:
    def test_specs_page_offers_start_to_those_who_may(self, client, deploy, people):
        client.force_login(people["alice"])
        assert "Start run</a>" in client.get("/specs/").content.decode()
        client.force_login(people["dave"])
        body = client.get("/specs/").content.decode()
        assert "deploy" in body and "Start run</a>" not in body
        assert client.post("/specs/deploy/start/", {"param_version": "1"}).status_code == 403

    def test_the_form_is_built_from_the_params(self, client, deploy, people):
        client.force_login(people["alice"])
        body = client.get("/specs/deploy/start/").content.decode()
        for name in ("param_version", "param_rollout", "param_replicas", "param_dry_run",
                     "param_notes", "idempotency_key", "goal", "title"):
            assert f'name="{name}"' in body
        assert "what to ship" in body and '<option value="full">' in body

    def test_submitting_opens_the_run_page(self, client, deploy, people):
        client.force_login(people["alice"])
        response = client.post("/specs/deploy/start/", {
            "param_version": "1.4", "param_rollout": "full", "param_replicas": "5",
            "title": "Ship 1.4", "idempotency_key": "ship-1.4"})
        run = Run.objects.get()
        assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
        assert run.params == {"version": "1.4", "rollout": "full", "replicas": 5,
                              "dry_run": False}
        assert run.title == "Ship 1.4" and run.requested_by == people["alice"]
        page = client.get(response["Location"]).content.decode()
        assert "<dt>rollout</dt><dd><bdi>full</bdi></dd>" in page
        again = client.post("/specs/deploy/start/", {
            "param_version": "1.4", "param_rollout": "full", "param_replicas": "5",
            "title": "Ship 1.4", "idempotency_key": "ship-1.4"})
        assert again["Location"] == f"/runs/{run.pk}/" and Run.objects.count() == 1

    def test_bad_values_are_shown_beside_their_field_and_nothing_starts(self, client, deploy,
                                                                        people):
        client.force_login(people["alice"])
        response = client.post("/specs/deploy/start/", {"param_replicas": "lots"})
        body = response.content.decode()
        assert response.status_code == 400 and "This field is required." in body
        assert "Enter a number." in body and not Run.objects.exists()

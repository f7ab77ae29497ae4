"""Schemathesis against /api/openapi.json: no 500s, and responses match the documented schema."""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.workflows.helpers import work
from tollgate.wsgi import application

# The document is not public by default (TOLLGATE_API_DOCS_PUBLIC): read it as a
# deployment that publishes it would.
with override_settings(TOLLGATE_API_DOCS_PUBLIC=True):
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", application)


@schema.hook
def map_body(ctx, body):
    """Runs are started of the spec the fixture loaded, so sequences get past the start."""
    if ctx.operation.path == "/api/runs" and isinstance(body, dict) and "spec" in body:
        return {**body, "spec": "release"}
    return body


@pytest.fixture
def keep_connection():
    """As Django's test client does: a request must not close the test's transaction."""
    from django.core import signals
    from django.db import close_old_connections

    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def token(api, release_spec, keep_connection):
    from goals.models import Goal
    from workflows import engine

    goal = Goal.objects.create(title="Schemathesis", owner=api["alice"].user)
    run = engine.open_run(release_spec, actor=api["alice"].user, goal=goal).run
    work(run, "build")
    return api["alice"].token


# What the document cannot say: whether a name the caller gives names someone or something
# here (a user, a group, a parameter the run's spec declares), and a spec's own rules (a
# step's dependencies named, a gate's group), which its validator checks and says where
# (tests/workflows/specs/). And one rule it says once, in its description, not on every
# string: no text holds NUL (U+0000), which PostgreSQL cannot store.
NAMES_NOTHING = ("no user named", "no such user", "There is no group named",
                 "There is no active person named", "does not exist",
                 "is not taken: this spec declares", "NUL characters are not allowed")


def carries_a_spec(case) -> bool:
    return case.operation.path == "/api/specs" or (
        isinstance(case.body, dict) and case.body.get("steps") is not None)


def names_nothing(response) -> bool:
    return response.status_code == 400 and any(
        phrase in response.text for phrase in NAMES_NOTHING)


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=int(os.environ.get("TOLLGATE_SCHEMA_EXAMPLES", "25")), deadline=None,
          derandomize=bool(os.environ.get("CI")),
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, token):
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    # A call the document allows is taken (or refused only for what it cannot know: the
    # object's existence, a conflict with its state, the caller's rights), so a client made
    # from the document makes no call the server refuses as malformed.
    checks = [not_a_server_error, response_schema_conformance, status_code_conformance]
    if not carries_a_spec(case) and not names_nothing(response):
        checks.append(positive_data_acceptance)
    case.validate_response(response, checks=checks)


NOT_OBJECTS = ['"hello world"', "[null, null]", "1", "true", "null", "[]"]


@pytest.mark.django_db
@pytest.mark.parametrize("body", NOT_OBJECTS)
def test_every_body_that_must_be_an_object_refuses_anything_else(api, release_spec, body):
    """Each operation in the document that takes a body, sent JSON that is not an object."""
    from goals.models import Goal
    from workflows import engine
    from workflows.models import Checkpoint, Run

    run = engine.open_run(release_spec, actor=api["alice"].user).run
    goal = Goal.objects.create(title="G")
    before = (Run.objects.count(), Goal.objects.count(), Checkpoint.objects.count())
    writes = [(path.removeprefix("/api"), method)
              for path, methods in schema.raw_schema["paths"].items()
              for method, operation in methods.items() if "requestBody" in operation]
    assert len(writes) >= 10
    for path, method in writes:
        url = "/api" + path.format(run_id=run.pk, goal_id=goal.pk, key="qa", name="release",
                                   action="archive")
        response = getattr(api["alice"], method.lower())(url, body)
        assert response.status_code == 400, (method, url, body, response.content)
        assert "must be a JSON object" in response.json()["error"]
    assert (Run.objects.count(), Goal.objects.count(), Checkpoint.objects.count()) == before


@pytest.mark.django_db
@pytest.mark.parametrize("field, value, problem", [
    ("goal", True, "valid integer"),
    ("goal", "1", "valid integer"),
    ("idempotency_key", 7, "valid string"),
    ("colour", "red", "Extra inputs"),
])
def test_types_are_strict_and_fields_known(api, release_spec, field, value, problem):
    from goals.models import Goal
    from workflows.models import Run

    Goal.objects.create(title="G")
    response = api["alice"].post("/api/runs", {"spec": "release", field: value})
    assert response.status_code == 400 and problem in response.json()["error"]
    assert not Run.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "20261203", "2026-13-01", "yesterday"])
def test_a_date_filter_is_a_date(api, value):
    response = api["alice"].get(f"/api/runs?opened_to={value}")
    assert response.status_code == 400 and "opened_to" in response.json()["error"]


@pytest.mark.django_db
def test_api_sequences_follow_the_documents_links_without_a_server_error(token):
    """The stateful phase: schemathesis chains calls along the links it finds in the
    document (a run created, then read, reported on, decided, cancelled; a goal created,
    then read and changed) and no sequence gets a 500 or an answer outside the document."""
    workflow = schema.as_state_machine()

    class Sequences(workflow):
        # Each sequence starts from the same rows: Hypothesis replays a sequence to shrink
        # it, and rows left by an earlier one would change what the replay's calls answer.
        def setup(self):
            self.savepoint = transaction.savepoint_create()

        def teardown(self):
            transaction.savepoint_rollback(self.savepoint)

        def get_call_kwargs(self, case):
            return {"headers": {"Authorization": f"Bearer {token}"}}

        def validate_response(self, response, case, **kwargs):
            case.validate_response(response, checks=[not_a_server_error,
                                                     response_schema_conformance])

    Sequences.run(settings=settings(
        max_examples=int(os.environ.get("TOLLGATE_SCHEMA_STATEFUL_EXAMPLES", "40")),
        deadline=None, derandomize=bool(os.environ.get("CI")), stateful_step_count=6,
        suppress_health_check=list(HealthCheck)))


def test_a_required_reason_is_described_as_saying_something(api, release_spec):
    """A blank skip reason, reassign reason or reject comment is refused, and the document
    says so: a client made from it sends none."""

    from workflows import engine

    document = api["alice"].get("/api/openapi.json").json()["components"]["schemas"]
    for model, name in (("SkipIn", "reason"), ("ReassignIn", "reason"), ("RejectIn", "comment")):
        assert document[model]["properties"][name]["pattern"] == r"\S", model
    alice = api["alice"].user  # an operator already
    run = engine.open_run(release_spec, actor=alice).run
    refused = api["alice"].post(f"/api/runs/{run.pk}/steps/build/skip", {"reason": "   "})
    assert refused.status_code == 400 and "reason is required" in refused.json()["error"]


@pytest.mark.django_db
def test_a_nul_in_a_query_string_is_refused_saying_so(api):
    answer = api["alice"].get("/api/runs", kind="a\x00b")
    assert answer.status_code == 400 and "kind: NUL characters are not allowed" in answer.json()[
        "error"]

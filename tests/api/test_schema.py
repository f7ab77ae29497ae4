"""Schemathesis against /api/openapi.json: no 500s, and responses match the documented schema."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.workflows.helpers import work
from tollgate.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", application)


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


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=int(os.environ.get("TOLLGATE_SCHEMA_EXAMPLES", "25")), deadline=None,
          derandomize=bool(os.environ.get("CI")),
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, token):
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                             status_code_conformance])

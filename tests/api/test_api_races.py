"""Concurrent idempotent starts through the API (threads, real transactions)."""

from __future__ import annotations

import pytest

from workflows.models import Run

from ..workflows.test_concurrency import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_posts_with_one_key_create_one_run(api, release_spec):
    def post(i):
        from django.test import Client

        client = Client(HTTP_AUTHORIZATION=f"Bearer {api['alice'].token}")
        return client.post("/api/runs", {"spec": "release", "idempotency_key": "ci-build-77"},
                           content_type="application/json")

    responses = race(8, post)
    assert all(not isinstance(r, Exception) for r in responses), responses
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 7 + [201]
    assert Run.objects.count() == 1
    run_id = Run.objects.get().pk
    assert {r.json()["id"] for r in responses} == {run_id}
    assert sum(r.json()["reused_existing"] for r in responses) == 7

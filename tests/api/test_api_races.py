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


def test_one_key_sent_for_two_specs_at_once_opens_one_run_of_each(api, release_spec):
    """A key is scoped to its spec: sent for two specs at once, it opens one run of each
    (neither refused, neither answered with the other's run), on every try; sent again, each
    finds its own."""
    from django.test import Client

    from workflows.specs.storage import store_spec

    store_spec({"name": "other", "steps": [
        {"key": "a", "run": {"callable": "workflows.callables.noop"}}]})
    for attempt in range(10):
        key = f"shared-{attempt}"

        def post(i, key=key):
            client = Client(HTTP_AUTHORIZATION=f"Bearer {api['alice'].token}")
            return client.post("/api/runs", {"spec": ("release", "other")[i % 2],
                                             "idempotency_key": key},
                               content_type="application/json")

        responses = race(4, post)
        assert sorted(r.status_code for r in responses) == [200, 200, 201, 201], [
            (r.status_code, r.content[:200]) for r in responses]
        runs = Run.objects.filter(idempotency_key=key)
        assert sorted(runs.values_list("spec_name", flat=True)) == ["other", "release"]
        assert {r.json()["spec"]: r.json()["id"] for r in responses} == {
            run.spec_name: run.pk for run in runs}

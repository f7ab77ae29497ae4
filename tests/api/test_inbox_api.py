"""GET /api/inbox: the gates waiting on the token's person, each as they see it (the read
model the web inbox renders), at the door: a real token over HTTP."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import make_user
from tests.workflows.helpers import waiting_releases
from workflows import engine
from workflows.models import Preference
from workflows.specs.storage import store_spec
from workflows.timing import clock

pytestmark = pytest.mark.django_db

SIGNED = {"name": "hotfix", "steps": [
    {"key": "ship", "title": "Ship it", "approval": {
        "group": "qa", "signature": {"meaning": "Approved for production"},
        "timeout_seconds": 3600}}]}


def open_waiting(spec, people, count: int = 1):
    return waiting_releases(spec, people["alice"], count)


def test_the_inbox_lists_the_gates_waiting_on_the_caller_as_they_see_them(api, people,
                                                                         release_spec):
    first, second = open_waiting(release_spec, people, 2)
    engine.approve(second, "qa", user=people["carol"], comment="fine")
    body = api["bob"].get("/api/inbox").json()
    assert body["count"] == 2
    gate = body["results"][0]  # the longest waiting first
    assert (gate["run"], gate["step"], gate["title"]) == (first.pk, "qa", "QA sign-off")
    assert gate["evidence_digest"] == first.steps.get(key="qa").evidence_digest
    assert gate["rule"] == "qa" and gate["waits_on"] == "qa"
    assert (gate["approvals"], gate["required"]) == (0, 2)
    assert gate["others"] == ["carol"] and gate["deciding_for"] is None
    assert gate["signing"] == "" and gate["page_only"] == ""
    assert gate["url"].endswith(f"/runs/{first.pk}/")
    # carol decided the second: nobody else may decide it but bob now
    assert body["results"][1]["others"] == [] and body["results"][1]["approvals"] == 1
    # carol's inbox no longer holds it; erin's holds nothing
    assert [g["run"] for g in api["carol"].get("/api/inbox").json()["results"]] == [first.pk]
    assert api["erin"].get("/api/inbox").json() == {"count": 0, "results": []}


def test_a_decision_made_from_the_inbox_entry_is_taken_as_seen(api, people, release_spec):
    run = open_waiting(release_spec, people)[0]
    gate = api["bob"].get("/api/inbox").json()["results"][0]
    decided = api["bob"].post(f"/api/runs/{gate['run']}/steps/{gate['step']}/approve",
                              {"comment": "looked", "seen": gate["evidence_digest"]})
    assert decided.status_code == 200, decided.json()
    assert run.steps.get(key="qa").approvals.get().user == people["bob"]
    assert api["bob"].get("/api/inbox").json()["count"] == 0


def test_a_signed_gate_says_only_its_page_decides_it_with_its_meaning_and_deadline(
        api, people):
    run = engine.open_run(store_spec(SIGNED)[0], actor=people["alice"]).run
    gate = api["bob"].get("/api/inbox").json()["results"][0]
    assert gate["signing"] == "Approved for production"
    assert gate["page_only"] == "it must be signed, which is done on its page"
    assert gate["deadline"]["then"] == "rejects itself"
    refused = api["bob"].post(f"/api/runs/{run.pk}/steps/ship/approve",
                              {"comment": "", "seen": gate["evidence_digest"]})
    assert refused.status_code == 403 and "must be signed" in refused.json()["error"]


def test_a_delegate_sees_whom_they_decide_for(api, people, release_spec):
    dee = make_user("dee")
    now = clock.now()
    Preference.objects.create(user=people["carol"], delegate=dee, away_from=now - timedelta(
        hours=1), away_until=now + timedelta(days=2))
    run = open_waiting(release_spec, people)[0]
    from tests.api.conftest import Api

    gate = Api(dee).get("/api/inbox").json()["results"][0]
    assert gate["run"] == run.pk and gate["deciding_for"] == "carol"


def test_the_inbox_is_narrowed_and_ordered_as_the_web_inbox_is(api, people, release_spec):
    runs = open_waiting(release_spec, people, 3)
    assert [g["run"] for g in api["bob"].get("/api/inbox", sort="age").json()["results"]] \
        == [r.pk for r in runs]
    assert api["bob"].get("/api/inbox", spec="nothing").json()["count"] == 0
    assert api["bob"].get("/api/inbox", group="qa", limit=1, offset=1).json()["results"][0][
        "run"] == runs[1].pk
    assert api["bob"].get("/api/inbox", sort="sideways").status_code == 400


def test_the_inbox_takes_the_same_statements_for_any_number_of_gates(api, people,
                                                                      release_spec):
    open_waiting(release_spec, people)
    api["bob"].get("/api/inbox")
    with CaptureQueriesContext(connection) as few:
        api["bob"].get("/api/inbox")
    open_waiting(release_spec, people, 6)
    with CaptureQueriesContext(connection) as more:
        assert api["bob"].get("/api/inbox").json()["count"] == 7
    assert len(few) == len(more)


@pytest.mark.django_db(transaction=True)
def test_the_inbox_over_http_with_a_token_as_the_guide_shows_it(live_server, people,
                                                                 release_spec):
    """The API guide's `curl … /api/inbox?sort=deadline`, as a script sends it."""
    import json
    import urllib.request

    from workflows.models import ApiToken

    run = open_waiting(release_spec, people)[0]
    token = ApiToken.objects.issue(people["bob"], "inbox-bot")[1]
    request = urllib.request.Request(f"{live_server.url}/api/inbox?sort=deadline",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = json.load(answer)
    assert [(g["run"], g["step"]) for g in body["results"]] == [(run.pk, "qa")]
    nobody = urllib.request.Request(f"{live_server.url}/api/inbox")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(nobody, timeout=30)
    assert refused.value.code == 401

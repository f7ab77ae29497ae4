"""A gate's row and its result lines say what happened once it is decided: a gate of several
stages names every stage that decided it, a stage never met says so rather than "waiting",
and a delegate reads whom they decided for."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Preference
from workflows.specs.storage import store_spec
from workflows.timing import clock

pytestmark = pytest.mark.django_db

PAYMENT = {"name": "payment", "steps": [
    {"key": "prepare", "title": "Prepare", "run": {"command": ["true"]}},
    {"key": "approve", "title": "Approve the payment", "depends_on": ["prepare"],
     "approval": {"rules": [
         {"group": "qa", "label": "QA", "order": 0},
         {"manager": True, "group": "qa", "label": "the requester's manager", "order": 1}]}}]}


def text(response) -> str:
    html = re.sub(r"(?s)<(script|style)[^>]*>.*?</\1>", "", response.content.decode())
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&#x27;", "'")


def decide(person, gate, action="approve", **fields):
    client = Client()
    client.force_login(person)
    gate.refresh_from_db()
    return client.post(f"/runs/{gate.run_id}/steps/{gate.key}/{action}/", {
        "via": "inbox", "evidence_digest": gate.evidence_digest, **fields},
        HTTP_HX_REQUEST="true")


@pytest.fixture
def gate(people):
    Preference.objects.create(user=people["alice"], manager=people["dave"])
    Preference.objects.create(user=people["carol"], away_from=clock.now() - timedelta(hours=1),
                              away_until=clock.now() + timedelta(days=2),
                              delegate=people["erin"])
    store_spec(PAYMENT)
    run = engine.open_run("payment", actor=people["alice"]).run
    work(run, "prepare")
    return run.steps.get(key="approve")


def test_a_delegate_reads_whom_they_decided_for(people, gate):
    page = text(decide(people["erin"], gate))
    assert "You approved Approve the payment for carol." in page


def test_a_delegates_bulk_decision_says_whom_it_was_for(people, gate):
    client = Client()
    client.force_login(people["erin"])
    gate.refresh_from_db()
    page = text(client.post("/inbox/decide/", {"gate": [gate.pk], "decision": "approve",
                                            f"seen-{gate.pk}": gate.evidence_digest},
                                HTTP_HX_REQUEST="true"))
    assert f"You approved Approve the payment ({gate.run}) for carol." in page, page[:3000]


def test_a_decided_gate_of_stages_names_every_stage(people, gate):
    decide(people["bob"], gate)
    page = text(decide(people["dave"], gate))
    assert "You approved Approve the payment." in page
    assert "gate: 2 of 2 from qa, dave (alice's manager)" in page
    assert "QA: 1 of 1 from qa (bob) · met" in page
    assert "the requester's manager: 1 of 1 from dave (alice's manager) (dave) · met" in page


def test_a_stage_never_met_of_a_rejected_gate_is_not_waiting(people, gate):
    decide(people["bob"], gate)
    page = text(decide(people["dave"], gate, "reject", comment="Not this quarter"))
    assert "You rejected Approve the payment." in page
    assert ("the requester's manager: 0 of 1 from dave (alice's manager) (dave) · not met"
            " · 1 reject") in page
    assert "· waiting" not in page and "opens when" not in page

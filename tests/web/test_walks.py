"""A page's request goes down the house: from the view through the read model to the
engine's facts and the models, and climbs back up (a call from a lower layer into a higher
one) at most three times. Walked for real (tests.support.walks), with several gates so that
any per-gate climb would show many times over."""

from __future__ import annotations

import pytest

from tests.support.walks import walk
from tests.workflows.helpers import waiting_releases
from workflows import engine

from .test_pages import as_user

pytestmark = pytest.mark.django_db

MOST = 3


@pytest.fixture
def gates(release_spec, people):
    return waiting_releases(release_spec, people["alice"], 4)


def climbs(call) -> list[tuple[str, str]]:
    response, trail = walk(call)
    assert response.status_code in (200, 302), response.content[:300]
    return trail.climbs


def test_the_inbox_climbs_back_up_at_most_three_times(client, gates, people):
    as_user(client, people["bob"])
    client.get("/")  # the session's first request sets what later ones read
    found = climbs(lambda: client.get("/"))
    assert len(found) <= MOST, found


def test_the_run_page_climbs_back_up_at_most_three_times(client, gates, people):
    as_user(client, people["bob"])
    client.get("/")
    engine.approve(gates[0], "qa", user=people["carol"], comment="fine")
    found = climbs(lambda: client.get(f"/runs/{gates[0].pk}/"))
    assert len(found) <= MOST, found


def test_an_approve_from_the_inbox_climbs_back_up_at_most_three_times(client, gates, people):
    as_user(client, people["bob"])
    client.get("/")
    gate = gates[1].steps.get(key="qa")
    found = climbs(lambda: client.post(
        f"/runs/{gates[1].pk}/steps/qa/approve/",
        {"view": "inbox", "evidence_digest": gate.evidence_digest}, HTTP_HX_REQUEST="true"))
    assert len(found) <= MOST, found


# A committed transition tells the outbox and the live pages through the engine's signal
# (the engine imports neither): the one climb a write makes, once per transaction.
SIGNAL = [("workflows.engine.rows", "workflows.delivery.outbox"),
          ("workflows.engine.rows", "workflows.reads.live")]


def test_a_bulk_decision_climbs_back_up_only_through_the_engines_signal(client, gates,
                                                                       people):
    """Each gate of a bulk decision is its own transaction (a refusal of one leaves the
    others decided), so the signal's climb comes once per gate; nothing else climbs."""
    as_user(client, people["bob"])
    client.get("/")
    data = {"decision": "approve", "comment": "all fine", "gate": []}
    for run in gates[2:]:
        gate = run.steps.get(key="qa")
        data["gate"].append(gate.pk)
        data[f"seen-{gate.pk}"] = gate.evidence_digest
    found = climbs(lambda: client.post("/inbox/decide/", data, HTTP_HX_REQUEST="true"))
    assert found == SIGNAL * len(data["gate"])


def test_a_climb_is_counted_where_a_lower_layer_calls_a_higher_one():
    """The walk itself: a model's code calling back into a page's is one climb."""
    from tests.support.walks import Walk

    trail = Walk(calls=[("workflows.web.views.inbox", "workflows.models.runs"),
                        ("workflows.models.runs", "workflows.web.cards"),
                        ("workflows.web.cards", "workflows.reads.briefs")])
    assert trail.climbs == [("workflows.models.runs", "workflows.web.cards")]

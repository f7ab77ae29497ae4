"""Teams with a real Huey consumer: the card posted by the worker, a press acknowledged by the
web process and decided by the worker, the card updated for everyone; and a press whose
doorbell was lost decided once a consumer starts."""

from __future__ import annotations

import json

import pytest
from huey.contrib.djhuey import HUEY

from tests.workflows.consumers import wait_for
from tests.workflows.helpers import work
from workflows import engine
from workflows.chat import teams as teams_chat
from workflows.models import Approval, ChatInteraction
from workflows.specs.storage import store_spec

from .fake_teams import FakeTeams
from .platforms import TeamsDriver

pytestmark = pytest.mark.django_db(transaction=True)

QA = "19:qa@thread.tacv2"
GATE = {"name": "ship", "steps": [
    {"key": "build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa"}}]}


@pytest.fixture
def fake_teams(settings, live_server):
    fake = FakeTeams()
    fake.env = {**fake.settings(), "TOLLGATE_TEAMS_CHANNELS": json.dumps({"qa": QA}),
                "TOLLGATE_BASE_URL": live_server.url}
    for name, value in fake.settings().items():
        setattr(settings, name, value)
    settings.TOLLGATE_TEAMS_CHANNELS = {"qa": QA}
    settings.TOLLGATE_BASE_URL = live_server.url
    fake.url = f"{live_server.url}/chat/teams/messages/"
    yield fake
    teams_chat._keys.cache_clear()
    fake.stop()


def test_a_press_is_decided_by_the_worker_and_the_card_follows(fake_teams, consumers,
                                                              people):
    consumers(**fake_teams.env)
    store_spec(GATE)
    run = engine.open_run("ship", actor=people["alice"]).run
    work(run, "build")
    wait_for(lambda: fake_teams.cards(QA), what="the card posted")
    gate = run.steps.get(key="qa")
    driver = TeamsDriver(fake_teams, fake_teams.url)
    driver.link(people["bob"])
    status, answer = driver.press(gate, "approve", "bob")
    assert status == 200 and answer["type"] == "application/vnd.microsoft.activity.message"
    wait_for(lambda: Approval.objects.filter(channel="chat").exists(), what="the decision")
    wait_for(lambda: "Approved by bob" in json.dumps(fake_teams.cards(QA)[0]),
             what="the card updated")
    run.refresh_from_db()
    assert run.status == "completed"
    assert len(fake_teams.cards(QA)) == 1


def test_a_press_whose_doorbell_was_lost_is_decided_later(fake_teams, consumers, people):
    store_spec(GATE)
    run = engine.open_run("ship", actor=people["alice"]).run
    work(run, "build")
    gate = run.steps.get(key="qa")
    driver = TeamsDriver(fake_teams, fake_teams.url)
    driver.link(people["bob"])
    assert driver.press(gate, "approve", "bob")[0] == 200
    HUEY.flush()  # every doorbell rung so far is lost
    assert ChatInteraction.objects.filter(done_at__isnull=True).count() == 1
    consumers(**fake_teams.env)
    wait_for(lambda: Approval.objects.filter(channel="chat").count() == 1,
             what="the press handled by the periodic task")
    wait_for(lambda: ChatInteraction.objects.filter(done_at__isnull=True).count() == 0,
             what="the press marked done")
    assert Approval.objects.count() == 1

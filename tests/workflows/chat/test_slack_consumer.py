"""Slack with a real Huey consumer: the gate posted by the worker, a press acknowledged by the
web process and decided by the worker, the message updated; and a press whose doorbell is
lost (no consumer when it came) decided once a consumer starts."""

from __future__ import annotations

import json

import pytest
from huey.contrib.djhuey import HUEY

from tests.workflows.consumers import wait_for
from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Approval, ChatIdentity, ChatInteraction
from workflows.specs.storage import store_spec

from .fake_slack import SIGNING_SECRET, TOKEN, FakeSlack, button

pytestmark = pytest.mark.django_db(transaction=True)

GATE = {"name": "ship", "steps": [
    {"key": "build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa"}}]}


@pytest.fixture
def fake_slack(settings, live_server):
    fake = FakeSlack()
    env = {"TOLLGATE_SLACK_BOT_TOKEN": TOKEN, "TOLLGATE_SLACK_SIGNING_SECRET": SIGNING_SECRET,
           "TOLLGATE_SLACK_API_URL": fake.api_url,
           "TOLLGATE_SLACK_CHANNELS": json.dumps({"qa": "C-QA"}),
           "TOLLGATE_BASE_URL": live_server.url}
    settings.TOLLGATE_SLACK_BOT_TOKEN = TOKEN
    settings.TOLLGATE_SLACK_SIGNING_SECRET = SIGNING_SECRET
    settings.TOLLGATE_SLACK_API_URL = fake.api_url
    settings.TOLLGATE_SLACK_CHANNELS = {"qa": "C-QA"}
    settings.TOLLGATE_BASE_URL = live_server.url
    fake.env = env
    fake.url = f"{live_server.url}/chat/slack/interactions/"
    yield fake
    fake.stop()


def test_a_press_is_decided_by_the_worker_and_the_message_follows(fake_slack, consumers,
                                                                 people):
    consumers(**fake_slack.env)
    store_spec(GATE)
    run = engine.open_run("ship", actor=people["alice"]).run
    work(run, "build")
    wait_for(lambda: fake_slack.calls_of("chat.postMessage"), what="the gate posted")
    gate = run.steps.get(key="qa")
    ChatIdentity.objects.create(provider="slack", team="T0ACME", chat_user="U-BOB",
                                user=people["bob"], matched_by="link")
    assert fake_slack.press(fake_slack.url, button(gate, "approve", "U-BOB", "bob")) == (
        200, b"")
    wait_for(lambda: Approval.objects.filter(channel="chat").exists(), what="the decision")
    wait_for(lambda: any("Approved by bob" in json.dumps(u["blocks"])
                         for u in fake_slack.calls_of("chat.update")), what="the update")
    run.refresh_from_db()
    assert run.status == "completed"


def test_a_press_whose_doorbell_was_lost_is_decided_later(fake_slack, consumers, people):
    store_spec(GATE)
    run = engine.open_run("ship", actor=people["alice"]).run
    work(run, "build")
    gate = run.steps.get(key="qa")
    ChatIdentity.objects.create(provider="slack", team="T0ACME", chat_user="U-BOB",
                                user=people["bob"], matched_by="link")
    assert fake_slack.press(fake_slack.url, button(gate, "approve", "U-BOB", "bob"))[0] == 200
    HUEY.flush()  # every doorbell rung so far is lost
    assert ChatInteraction.objects.filter(done_at__isnull=True).count() == 1
    consumers(**fake_slack.env)
    wait_for(lambda: Approval.objects.filter(channel="chat").count() == 1,
             what="the press handled by the periodic task")
    wait_for(lambda: ChatInteraction.objects.filter(done_at__isnull=True).count() == 0,
             what="the press marked done")
    assert Approval.objects.count() == 1

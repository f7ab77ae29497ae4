from __future__ import annotations

import pytest

from workflows.delivery import outbox

from .fake_slack import SIGNING_SECRET, TOKEN, FakeSlack


@pytest.fixture
def slack(settings, live_server, monkeypatch):
    """Tollgate (the live server) pointed at a fake Slack, the qa group's gates going to
    channel C-QA. The outbox is delivered in-process after each commit; presses are only
    recorded as doorbells (`slack.doorbells`), for the test to handle as the worker would."""
    fake = FakeSlack()
    settings.TOLLGATE_SLACK_BOT_TOKEN = TOKEN
    settings.TOLLGATE_SLACK_SIGNING_SECRET = SIGNING_SECRET
    settings.TOLLGATE_SLACK_API_URL = fake.api_url
    settings.TOLLGATE_SLACK_CHANNELS = {"qa": "C-QA", "ops": "C-OPS"}
    settings.TOLLGATE_BASE_URL = live_server.url
    fake.url = f"{live_server.url}/chat/slack/interactions/"
    fake.doorbells = []
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", outbox.deliver)
    monkeypatch.setattr("workflows.delivery.dispatch.handle_chat_press", fake.doorbells.append)
    yield fake
    fake.stop()

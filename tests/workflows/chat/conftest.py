from __future__ import annotations

import pytest

from workflows.chat import teams as teams_chat
from workflows.delivery import outbox

from .fake_slack import SIGNING_SECRET, TOKEN, FakeSlack
from .fake_teams import FakeTeams
from .platforms import SlackDriver, TeamsDriver


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


@pytest.fixture
def teams(settings, live_server, monkeypatch):
    """Tollgate pointed at a fake Teams (Bot Connector, token endpoint, OpenID keys), the qa
    group's gates going to channel 19:qa@thread.tacv2; as `slack`, the outbox delivered
    in-process and presses kept as doorbells."""
    fake = FakeTeams()
    for name, value in fake.settings().items():
        setattr(settings, name, value)
    settings.TOLLGATE_TEAMS_CHANNELS = dict(TeamsDriver.group_channels)
    settings.TOLLGATE_BASE_URL = live_server.url
    fake.url = f"{live_server.url}/chat/teams/messages/"
    fake.doorbells = []
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", outbox.deliver)
    monkeypatch.setattr("workflows.delivery.dispatch.handle_chat_press", fake.doorbells.append)
    yield fake
    teams_chat._keys.cache_clear()
    fake.stop()


@pytest.fixture(params=["slack", "teams"])
def platform(request, monkeypatch):
    """Each chat platform in turn, behind the same driver, with the other set up beside it
    as a deployment with both has them (their presses ring one doorbell list)."""
    slack, teams = request.getfixturevalue("slack"), request.getfixturevalue("teams")
    slack.doorbells = teams.doorbells = []
    monkeypatch.setattr("workflows.delivery.dispatch.handle_chat_press",
                        slack.doorbells.append)
    if request.param == "slack":
        return SlackDriver(slack, slack.url)
    return TeamsDriver(teams, teams.url)

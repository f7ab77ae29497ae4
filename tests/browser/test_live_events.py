"""An open inbox with an events stream, in Chromium: a new gate for the viewer's group
shows without a poll each second (the page's fallback poll is every 30 s)."""

from __future__ import annotations

import pytest

from workflows import engine
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_gate_reaches_an_open_inbox_through_its_stream(page, people, settings, events_server):
    origin = f"http://127.0.0.1:{events_server}"
    settings.TOLLGATE_LIVE_EVENTS_URL = f"{origin}/live/events"
    settings.SECURE_CSP = {**settings.SECURE_CSP,
                           "connect-src": [*settings.SECURE_CSP["connect-src"], origin]}
    store_spec({"name": "sign-off", "steps": [
        {"key": "qa", "title": "QA sign-off", "approval": {"group": "qa"}}]})
    login(page, "bob")
    streams = []
    page.on("request", lambda request: streams.append(request.url)
            if "/live/events" in request.url else None)
    page.goto("/")
    page.wait_for_function("() => document.querySelector('#inbox-poll').dataset.events")
    assert page.locator("article.gate").count() == 0
    page.evaluate("window.__noReload = true")
    step = engine.open_run("sign-off", actor=people["alice"]).run.steps.get(key="qa")
    # Well within the fallback poll's 30 s: only the stream can have brought it.
    page.wait_for_selector(f"#gate-{step.pk}", timeout=20000)
    assert page.evaluate("window.__noReload") is True
    assert len(streams) >= 2  # the first said "changed"; the next holds the new versions
    page.goto("about:blank")  # its stream closes with the page

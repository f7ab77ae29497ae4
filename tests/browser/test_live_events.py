"""An open inbox with an events stream, in Chromium: a new gate for the viewer's group
shows without a poll each second (the page's safety-net poll set an hour away)."""

from __future__ import annotations

import pytest

from workflows import engine
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_gate_reaches_an_open_inbox_through_its_stream(page, people, settings, events_server):
    hold_a_stream(settings, events_server)
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
    # The safety-net poll is hours away and the stream stays up: only it can bring it.
    page.wait_for_selector(f"#gate-{step.pk}")
    assert page.evaluate("window.__noReload") is True
    assert len(streams) >= 2  # the first said "changed"; the next holds the new versions
    page.goto("about:blank")  # its stream closes with the page


def hold_a_stream(settings, events_server) -> None:
    origin = f"http://127.0.0.1:{events_server}"
    settings.TOLLGATE_LIVE_EVENTS_URL = f"{origin}/live/events"
    settings.SECURE_CSP = {**settings.SECURE_CSP,
                           "connect-src": [*settings.SECURE_CSP["connect-src"], origin]}
    # The pages' safety-net poll far beyond any wait of a test: whatever arrives came by
    # the stream (or the 1 s poll a page falls back to while its stream is down).
    settings.TOLLGATE_LIVE_SLOW_POLL_SECONDS = 3600


def test_an_open_run_page_keeps_its_stream_through_every_update(page, people, settings,
                                                                 events_server):
    hold_a_stream(settings, events_server)
    store_spec({"name": "four", "steps": [
        {"key": f"s{i}", "title": f"Step {i}", **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(4)]})  # wait steps: each reported in turn
    run = engine.open_run("four", actor=people["alice"]).run
    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_function("() => document.querySelector('#run-poll').dataset.events")
    for i in range(4):
        seq = engine.record_transition(run, f"s{i}", step_status="completed",
                                       actor=people["alice"]).seq
        page.wait_for_function(  # each update, not only the first, within seconds
            f"() => Number(document.querySelector('#run-poll').dataset.seq) >= {seq}")


def test_a_page_whose_events_server_freezes_falls_back_to_polling_each_second(
        page, people, settings, events_server):
    import os
    import signal

    hold_a_stream(settings, events_server)
    store_spec({"name": "sign-off", "steps": [
        {"key": "qa", "title": "QA sign-off", "approval": {"group": "qa"}}]})
    login(page, "bob")
    page.goto("/")
    page.wait_for_function("() => document.querySelector('#inbox-poll').dataset.events")
    from tests.conftest import EVENTS_SERVERS

    server = EVENTS_SERVERS[events_server]
    os.kill(server, signal.SIGSTOP)  # frozen: its streams stay open and say nothing
    try:
        step = engine.open_run("sign-off", actor=people["alice"]).run.steps.get(key="qa")
        page.wait_for_selector(f"#gate-{step.pk}")
    finally:
        os.kill(server, signal.SIGCONT)

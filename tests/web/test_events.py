"""Server-sent events for open pages (tollgate.events under uvicorn, a real process): a
stream says `changed` once something its page watches rings, and only to the holder of a
page's own token; pages offer a stream where one is configured."""

from __future__ import annotations

import http.client
import time
from urllib.parse import quote

import pytest
from django.conf import settings

from tests.conftest import make_user
from workflows.reads import live

pytestmark = pytest.mark.django_db(transaction=True)


def open_stream(port: int, page: str, watching: dict) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/live/events?page={quote(page)}&watch={quote(watching['watch'])}"
                        f"&seen={quote(watching['seen'])}")
    return conn.getresponse()


def heard(stream, event: bytes, seconds: float = 30) -> bytes:
    """What a stream said up to `event`, or up to `seconds` (its heartbeats keep the socket
    busy, so a socket timeout alone would never end the wait)."""
    said = b""
    deadline = time.monotonic() + seconds
    while event not in said and time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        said += line
    return said


def test_a_stream_says_changed_once_something_its_page_watches_rings(events_server):
    ann = make_user("ann", "qa")
    watching = live.watch(ann.pk, "/", live.inbox_keys(ann))
    stream = open_stream(events_server, "/", watching)
    assert stream.status == 200 and stream.getheader("Content-Type") == "text/event-stream"
    assert stream.readline() == b": open\n"  # open, and nothing changed yet
    live.ring([live.group_key("qa")])  # a gate now waits on ann's group
    assert stream.read().endswith(b"event: changed\ndata: \n\n")  # said, and the stream ends


def test_a_stream_opened_with_stale_versions_says_changed_at_once(events_server):
    """A change that landed between the page's read and its stream is not missed."""
    ann = make_user("ann")
    watching = live.watch(ann.pk, "/runs/7/", [live.run_key(7)])
    live.ring([live.run_key(7)])
    assert b"event: changed" in open_stream(events_server, "/runs/7/", watching).read()


@pytest.mark.parametrize("case", ["another page", "forged", "nothing seen", "other path"])
def test_a_stream_needs_its_own_pages_token(events_server, case):
    ann = make_user("ann")
    watching = live.watch(ann.pk, "/runs/7/", [live.run_key(7)])
    page = "/" if case == "another page" else "/runs/7/"
    if case == "forged":
        watching["watch"] = watching["watch"][:-2] + "xx"
    if case == "nothing seen":
        watching["seen"] = ""
    if case == "other path":
        conn = http.client.HTTPConnection("127.0.0.1", events_server, timeout=30)
        conn.request("GET", "/live/other")
        assert conn.getresponse().status == 404
        return
    answer = open_stream(events_server, page, watching)
    assert answer.status == 403 and b"not valid" in answer.read()


def test_pages_hold_a_stream_where_one_is_configured(client, settings):
    ann = make_user("ann", "qa")
    client.force_login(ann)
    assert "data-events" not in client.get("/").text
    settings.TOLLGATE_LIVE_EVENTS_URL = "/live/events"
    page = client.get("/").text
    assert 'data-events="/live/events"' in page
    assert "tollgate:changed, every 30s" in page  # the safety-net poll


def test_a_stream_ends_with_its_session_and_its_token_opens_no_more(events_server, client):
    ann = make_user("ann", "qa")
    client.force_login(ann)
    session = client.session.session_key
    watching = live.watch(ann.pk, "/", [*live.inbox_keys(ann), live.session_key(session)])
    stream = open_stream(events_server, "/", watching)
    assert stream.status == 200 and stream.readline() == b": open\n"
    client.post("/logout/")
    assert b"event: changed" in heard(stream, b"event: changed")
    again = open_stream(events_server, "/", watching)
    assert again.status == 403 and b"has ended" in again.read()


def test_one_person_holds_a_bounded_number_of_streams(events_server, settings):
    ann, bob = make_user("ann"), make_user("bob")
    cap = settings.TOLLGATE_LIVE_STREAMS_PER_PERSON
    watching = live.watch(ann.pk, "/runs/7/", [live.run_key(7)])
    held = [open_stream(events_server, "/runs/7/", watching) for _ in range(cap)]
    assert all(s.status == 200 and s.readline() == b": open\n" for s in held)
    refused = open_stream(events_server, "/runs/7/", watching)
    assert refused.status == 429
    # Someone else still gets theirs.
    other = open_stream(events_server, "/runs/7/", live.watch(bob.pk, "/runs/7/",
                                                              [live.run_key(7)]))
    assert other.status == 200
    for stream in held:
        stream.close()


@pytest.mark.skipif(bool(settings.TOLLGATE_LIVE_REDIS_URL),
                    reason="the versions are in Redis here; this takes the file's away")
def test_a_stream_whose_versions_cannot_be_read_says_down(events_server):
    """The versions' store gone (Redis away, the file unreadable): each open stream says
    "down" and ends, so its page polls the database each second instead of waiting."""
    import os

    ann = make_user("ann")
    watching = live.watch(ann.pk, "/runs/7/", [live.run_key(7)])
    stream = open_stream(events_server, "/runs/7/", watching)
    assert stream.status == 200 and stream.readline() == b": open\n"
    path = settings.TOLLGATE_LIVE_FILE
    os.replace(path, path + ".away")
    os.mkdir(path)  # the store cannot be opened
    try:
        assert b"event: down" in heard(stream, b"event: down")
    finally:
        os.rmdir(path)
        os.replace(path + ".away", path)

"""Server-sent events for open pages: `uvicorn tollgate.events:app`, mounted at /live/events.

An open inbox or run page (with `TOLLGATE_LIVE_EVENTS_URL` set) holds one stream here
instead of polling each second: `GET /live/events?page=<its path>&watch=<its signed
keys>&seen=<what it saw of them>`. The stream says `changed` once something the page
watches has rung (workflows.reads.live) and ends; the page then asks its view for what changed,
as its poll does, and opens a new stream with the versions the answer gives.

One loop per process reads the versions of every key its open streams watch, all in one
read, every LOOK_SECONDS, so a stream costs nothing while nothing changes but a
heartbeat. Like the quiet poll, a stream reads neither the session nor the database: it
says only "something changed", and only to the holder of a page's own unexpired token.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tollgate.settings")
django.setup()

from django.conf import settings  # noqa: E402  (after Django is set up)

from workflows.reads import live  # noqa: E402

log = logging.getLogger(__name__)

LOOK_SECONDS = 0.25  # how often the versions are read while streams are open
# An idle stream says "still" this often: proxies keep it open, and the page knows its
# stream is alive (three silent beats and it polls each second instead).
HEARTBEAT_SECONDS = 5.0
PATH = "/live/events"


@dataclass(eq=False)
class Stream:
    """An open page's stream: whose it is, the keys it watches and the digest of what it
    saw."""

    user_id: int
    keys: list[str]
    seen: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    down: bool = False  # the versions cannot be read: the page must poll


class Hub:
    """The open streams of this process, and the loop that looks at their versions."""

    def __init__(self) -> None:
        self.streams: set[Stream] = set()
        self.wake = asyncio.Event()

    def add(self, stream: Stream) -> None:
        self.streams.add(stream)
        self.wake.set()

    async def run(self) -> None:
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            await self.look()
            await asyncio.sleep(LOOK_SECONDS)

    async def look(self) -> None:
        streams = [stream for stream in self.streams if not stream.changed.is_set()]
        if not streams:
            return
        try:
            found = await asyncio.to_thread(
                live.versions, [key for stream in streams for key in stream.keys])
        except Exception:  # the versions are a hint: the pages poll each second meanwhile
            log.warning("Could not read page versions for open streams", exc_info=True)
            for stream in streams:
                stream.down = True
                stream.changed.set()
            return
        for stream in streams:
            if live.digest([found[key] for key in stream.keys]) != stream.seen:
                stream.changed.set()


HUB: Hub | None = None


async def app(scope, receive, send) -> None:
    """The ASGI application."""
    global HUB
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    if scope["path"] != PATH or scope["method"] != "GET":
        await _answer(send, 404, b"Not found\n")
        return
    try:
        query = {name: values[0] for name, values in parse_qs(
            scope["query_string"].decode(), max_num_fields=8).items()}
    except (UnicodeDecodeError, ValueError):
        query = {}
    watched = live.watched(query.get("watch", ""), query.get("page", ""))
    if watched is None or not query.get("seen"):
        await _answer(send, 403, b"This page's watch token is not valid here.\n")
        return
    user_id, keys = watched
    try:
        found = await asyncio.to_thread(live.versions, [k for k in keys if k.startswith("s:")])
    except Exception:
        found = {}
    if live.ended(keys, found):
        await _answer(send, 403, b"The session this page was opened in has ended.\n")
        return
    if HUB is None:
        HUB = Hub()
        asyncio.get_running_loop().create_task(HUB.run())
    cap = settings.TOLLGATE_LIVE_STREAMS_PER_PERSON
    if cap and sum(1 for s in HUB.streams if s.user_id == user_id) >= cap:
        await _answer(send, 429, b"Too many open streams for one person; the page polls.\n")
        return
    stream = Stream(user_id, keys, query["seen"])
    # Any origin may hold a stream (the events server may sit on a host of its own): it
    # says only "changed", and only to the holder of a page's token.
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"),
        (b"x-accel-buffering", b"no"), (b"access-control-allow-origin", b"*")]})
    await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
    HUB.add(stream)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        while not gone.done():
            changed = asyncio.ensure_future(stream.changed.wait())
            await asyncio.wait({changed, gone}, timeout=HEARTBEAT_SECONDS,
                               return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if gone.done():
                return
            if stream.changed.is_set():
                said = b"down" if stream.down else b"changed"
                await send({"type": "http.response.body",
                            "body": b"event: " + said + b"\ndata: \n\n", "more_body": False})
                return
            await send({"type": "http.response.body", "body": b"event: still\ndata: \n\n",
                        "more_body": True})
    finally:
        HUB.streams.discard(stream)
        gone.cancel()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": body})

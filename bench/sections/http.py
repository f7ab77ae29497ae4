"""The web under gunicorn: approve beside /healthz, and what polling inboxes cost."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.plumbing import analyze, floor_tables, gate_spec
from tests.support.processes import free_port, start_gunicorn, stop


def measure(bench) -> None:
    import http.client
    import threading

    from django.contrib.auth.models import Group, User
    from django.test import Client

    from workflows import engine
    from workflows.models import Step

    spec = gate_spec()
    user, _ = User.objects.get_or_create(username="bench-http")
    user.groups.add(Group.objects.get(name="bench-qa"))
    runs = [engine.open_run(spec).run.pk for _ in range(bench.pick(60, 300, 1000))]
    seconds = bench.pick(1.0, 5.0, 5.0)
    client = Client()
    client.force_login(user)
    client.get("/")
    cookie = f"sessionid={client.cookies['sessionid'].value}; " \
             f"csrftoken={client.cookies['csrftoken'].value}"
    csrf = client.cookies["csrftoken"].value
    port = free_port()
    # As the production command of docs/operators.md runs it: four sync workers on two cores, so
    # that one waiting on the database does not leave a core idle.
    # bench.web_settings: Tollgate's pages and `bench/write/`, the least an approve does.
    floor_tables()
    web = start_gunicorn({**os.environ, **bench.env,
                          "DJANGO_SETTINGS_MODULE": "bench.web_settings"}, port, workers=4)
    try:
        def load(paths, method="GET", seconds=5.0, clients=8, body=None):
            done, errors = [], []
            stop = time.perf_counter() + seconds
            pending = list(paths)
            lock = threading.Lock()

            def worker():
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                while time.perf_counter() < stop:
                    with lock:
                        if not pending:
                            return
                        path = pending.pop() if method == "POST" else pending[0]
                    sent = body(path) if callable(body) else body
                    conn.request(method, path, body=sent, headers={
                        "Cookie": cookie, "X-CSRFToken": csrf, "HX-Request": "true",
                        "Host": "127.0.0.1",
                        "Content-Type": "application/x-www-form-urlencoded"})
                    response = conn.getresponse()
                    response.read()
                    (done if response.status < 400 else errors).append(response.status)

            started = time.perf_counter()
            threads = [threading.Thread(target=worker) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
            return {"requests": len(done), "errors": len(errors), "seconds": elapsed,
                    "rps": len(done) / elapsed}

        analyze()
        for path in ("/healthz", f"/runs/{runs[0]}/", "/"):  # every worker warm
            load([path], seconds=1.0)
        floor = load(["/healthz"], seconds=seconds)
        page = load([f"/runs/{runs[0]}/"], seconds=seconds)
        polls = inbox_polls(bench, client, port, load, web.pid, seconds)
        latency = change_latency(bench, client, port, spec, user, bench.pick(5, 10, 20))
        streams = event_streams(bench, client, port, spec, polls, seconds,
                                bench.pick(5, 10, 20))
        # The least an approve must do: signed in, CSRF, one UPDATE+INSERT committed.
        write = load(["/bench/write/"] * 1_000_000, "POST", seconds=seconds)
        if write["errors"] or not write["requests"]:
            raise RuntimeError(f"the signed-in write was refused: {write}")
        half = len(runs) // 2
        # Approve as the inbox's button does (the decided card comes back), and as the
        # run page's does (the whole run comes back).
        # Each form carries the evidence digest its page was drawn with.
        shown = dict(Step.objects.filter(run_id__in=runs, key="gate").values_list(
            "run_id", "evidence_digest"))

        def form(extra=""):
            return lambda path: f"{extra}evidence_digest={shown[int(path.split('/')[2])]}"

        inbox = load([f"/runs/{pk}/steps/gate/approve/" for pk in runs[:half]], "POST",
                     body=form("view=inbox&"), seconds=seconds)
        approve = load([f"/runs/{pk}/steps/gate/approve/" for pk in runs[half:]], "POST",
                       body=form(), seconds=seconds)
        bench.results["http"] = {
            "clients": 8, "gunicorn_workers": 4, "floor_healthz": floor,
            "run_page": page, "approve_from_inbox": inbox, "approve": approve,
            "authenticated_write": write,
            "inbox_polls": polls, "change_to_open_inbox_ms": latency,
            "event_streams": streams,
            "ratio_to_floor": {"run_page": page["rps"] / floor["rps"],
                               "authenticated_write": write["rps"] / floor["rps"],
                               "approve_from_inbox": inbox["rps"] / floor["rps"],
                               "approve": approve["rps"] / floor["rps"]},
            "target_ratio": {"approve_from_inbox": 0.4, "approve": 0.3}}
    finally:
        stop(web, sig=15)


def inbox_polls(bench, client, port, load, web_pid, seconds) -> dict:
    """What 500 open inboxes cost, each showing its cards (200 here): polled as the page
    polls now, each second with the versions of what it watches (answered before Django
    when nothing rang), and as it polled before, every 5 s read from the database. The CPU
    gunicorn and the database spend per poll, scaled to 500 inboxes, as a share of one
    core."""
    import re
    from urllib.parse import quote

    from bench import scale

    body = client.get("/").text
    shown = re.findall(r'name="have" value="([0-9]+:[0-9.]+)"', body)
    watch, seen = page_versions(body)
    if not shown or not seen:
        raise RuntimeError("the inbox showed no cards, or no versions, to poll for")
    have = "&".join(f"have={item}" for item in shown)
    workers = [int(pid) for pid in Path(f"/proc/{web_pid}/task/{web_pid}/children")
               .read_text().split()]
    servers = scale.postgres_pids() if bench.backend == "postgres" else []

    def cost(path, every):
        cpu = scale.cpu_seconds([web_pid, *workers]), scale.cpu_seconds(servers)
        done = load([path], seconds=seconds)
        polls = max(done["requests"], 1)
        web_cpu = (scale.cpu_seconds([web_pid, *workers]) - cpu[0]) / polls
        db_cpu = (scale.cpu_seconds(servers) - cpu[1]) / polls
        return {**done, "web_cpu_ms_per_poll": web_cpu * 1e3,
                "database_cpu_ms_per_poll": db_cpu * 1e3, "poll_every_s": every,
                "cores_for_500_inboxes": (web_cpu + db_cpu) * 500 / every}

    versions = cost(f"/?poll=1&watch={quote(watch)}&seen={seen}&{have}", 1)
    database = cost(f"/?poll=1&{have}", 5)
    return {**versions, "cards": len(shown), "database_polls": database,
            "target_cores": 0.2}


def page_versions(body: str) -> tuple[str, str]:
    """The `watch` and `seen` a page's poller sends, as the page holds them."""
    import re

    return (re.search(r'name="watch" value="([^"]*)"', body)[1],
            re.search(r'name="seen" value="([^"]*)"', body)[1])


def change_latency(bench, client, port, spec, user, trials: int) -> dict:
    """From a change committing to an open inbox polling as the page does (each second,
    with the versions each answer gives) getting it: a new gate in the viewer's group."""
    import http.client
    import random
    import threading
    from urllib.parse import quote

    from django.contrib.auth.models import User

    from workflows import engine

    cookie = f"sessionid={client.cookies['sessionid'].value}"
    watch, seen = page_versions(client.get("/").text)
    state = {"watch": watch, "seen": seen}
    heard, stop = [], threading.Event()
    requester = User.objects.get_or_create(username="bench-requester", is_superuser=True)[0]

    def poller():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while not stop.is_set():
            conn.request("GET", f"/?poll=1&watch={quote(state['watch'])}&seen={state['seen']}"
                         "&have=1:1.0", headers={"Cookie": cookie, "HX-Request": "true",
                                                 "Host": "127.0.0.1"})
            response = conn.getresponse()
            response.read()
            if response.getheader("Tollgate-Seen"):
                state["watch"] = response.getheader("Tollgate-Watch")
                state["seen"] = response.getheader("Tollgate-Seen")
            if response.status == 200:
                heard.append(time.perf_counter())
            stop.wait(1.0)

    thread = threading.Thread(target=poller)
    thread.start()
    delays, missed = [], 0
    try:
        for _ in range(trials):
            time.sleep(random.uniform(0.3, 1.3))  # at any point of the poll's second
            count = len(heard)
            committed = time.perf_counter()
            engine.open_run(spec, actor=requester)
            # A change never heard fails the section; one heard late is a figure.
            while len(heard) == count and time.perf_counter() - committed < 120:
                time.sleep(0.005)
            if len(heard) == count:
                missed += 1
                continue
            delays.append((heard[-1] - committed) * 1e3)
    finally:
        stop.set()
        thread.join()
    from tests.support.stats import summary

    if missed:
        raise RuntimeError(f"{missed} of {trials} changes never reached the open inbox "
                           "within 120 s")
    return {**summary(delays), "max": max(delays), "trials": trials, "target_ms": 1000}


def event_streams(bench, client, port, spec, polls: dict, seconds: float, trials: int) -> dict:
    """500 open inboxes holding an events stream each (tollgate.events under uvicorn) while
    nothing changes: the events server's CPU, plus each page's fallback poll every 30 s at
    the quiet poll's measured cost, as a share of one core. Then, from a change committing
    to an open inbox having it: the stream says "changed" and the page asks its view, as
    page.js does."""
    import http.client
    import random
    import socket
    import subprocess
    import sys
    from urllib.parse import quote

    from bench import scale
    from tests.support.processes import ROOT, free_port, port_open, stop, wait_for
    from tests.support.stats import summary
    from workflows import engine

    body = client.get("/").text
    watch, seen = page_versions(body)
    events_port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tollgate.events:app", "--host", "127.0.0.1",
         "--port", str(events_port), "--log-level", "warning", "--no-access-log"],
        # One person's inbox stands in for 500 people's (a stream costs the same whoever
        # holds it), so the per-person cap is lifted for this server.
        cwd=ROOT, env={**os.environ, **bench.env, "TOLLGATE_LIVE_STREAMS_PER_PERSON": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    request = (f"GET /live/events?page=/&watch={quote(watch)}&seen={seen} HTTP/1.1\r\n"
               f"Host: 127.0.0.1\r\n\r\n").encode()
    try:
        wait_for(lambda: port_open(events_port) or server.poll() is not None, 30,
                 what="the events server")
        sockets = []
        for _ in range(500):
            sock = socket.create_connection(("127.0.0.1", events_port), timeout=10)
            sock.sendall(request)
            sockets.append(sock)
        for sock in sockets:  # each stream open (its first line read) before measuring
            if b": open" not in read_until(sock, b": open"):
                raise RuntimeError("a stream did not open")
        cpu = scale.cpu_seconds([server.pid])
        time.sleep(seconds)
        idle = (scale.cpu_seconds([server.pid]) - cpu) / seconds
        for sock in sockets:
            sock.close()
        fallback = polls["web_cpu_ms_per_poll"] / 1e3 * 500 / 30
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        delays = []
        for _ in range(trials):
            watch, seen = page_versions(client.get("/").text)
            sock = socket.create_connection(("127.0.0.1", events_port), timeout=10)
            sock.sendall((f"GET /live/events?page=/&watch={quote(watch)}&seen={seen} "
                          "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").encode())
            read_until(sock, b": open")
            time.sleep(random.uniform(0.1, 0.6))
            committed = time.perf_counter()
            engine.open_run(spec)
            if b"event: changed" not in read_until(sock, b"event: changed"):
                raise RuntimeError("a stream did not say its inbox changed")
            sock.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", f"/?poll=1&watch={quote(watch)}&seen={seen}&have=1:1.0",
                         headers={"Cookie": cookie, "HX-Request": "true",
                                  "Host": "127.0.0.1"})
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"the page's ask after its stream answered {answer.status}")
            delays.append((time.perf_counter() - committed) * 1e3)
    finally:
        stop(server, sig=15)
    return {"streams": 500, "events_server_cores": idle, "fallback_poll_cores": fallback,
            "cores_for_500_inboxes": idle + fallback, "target_cores": 0.2,
            "change_to_open_inbox_ms": {**summary(delays), "max": max(delays),
                                        "trials": trials, "target_ms": 1000}}


def read_until(sock, marker: bytes, timeout: float = 10) -> bytes:
    """What a socket sends until `marker` (or `timeout` seconds, or its end)."""
    received, deadline = b"", time.monotonic() + timeout
    sock.settimeout(timeout)
    while marker not in received and time.monotonic() < deadline:
        chunk = sock.recv(4096)
        if not chunk:
            break
        received += chunk
    return received

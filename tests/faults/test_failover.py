"""PostgreSQL failover: a synchronous standby promoted while the web server, two consumers and
the sweeper run, twice. Every transition the primary had committed is on the new primary,
no step ran twice at once, nothing was stuck, every run completed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psycopg
import pytest
from django.db import connection

from ..support.attempts import logged_shell, overlaps
from ..support.postgres_pair import PostgresPair, binaries
from ..support.processes import ROOT, listener, start_gunicorn, stop, wait_for
from ..workflows.consumers import Consumer, consumer_env
from .conftest import ANOMALIES, TALLY, injected

pytestmark = [
    pytest.mark.consumer,
    pytest.mark.skipif(connection.vendor != "postgresql" or binaries() is None
                       or os.environ.get("TOLLGATE_PGBOUNCER") == "1",
                       reason="PostgreSQL's own servers, promoted (not through the pooler)"),
]

ROUNDS = 2  # failovers
RUNS_PER_ROUND = 16


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def committed(server) -> set[tuple]:
    """Every checkpoint another session can see on this server: only what its synchronous
    standby has too (a commit is visible once the standby has confirmed it)."""
    with psycopg.connect(server.dsn("tollgate"), connect_timeout=5) as conn:
        return set(conn.execute("SELECT id, run_id, seq, kind FROM workflows_checkpoint"))


class Client:
    """The API over real HTTP, counting what it was told was done."""

    def __init__(self, port: int, tokens: dict):
        self.port, self.tokens = port, tokens
        self.keys: list[str] = []  # idempotency keys asked for
        self.started: dict[str, int] = {}  # idempotency key: run id
        self.approved: set[int] = set()
        self.errors = 0

    def call(self, path: str, who: str, data: dict | None):
        """POST `data`, or GET with None."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if data is None else json.dumps(data).encode(),
            headers={"Authorization": f"Bearer {self.tokens[who]}",
                     "Content-Type": "application/json"},
            method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except OSError:
            return None, None

    def start(self, key: str) -> None:
        if key not in self.keys:
            self.keys.append(key)
        status, body = self.call("/api/runs", "alice", {"spec": "failover",
                                                          "idempotency_key": key})
        if status in (200, 201):
            self.started[key] = body["id"]
        elif status is None or status >= 500:
            self.errors += 1
            TALLY["HTTP 500s"] += status is not None and status != 503

    def approve_waiting(self) -> None:
        for run_id in set(self.started.values()) - self.approved:
            status, run = self.call(f"/api/runs/{run_id}", "bob", None)
            if status != 200:
                continue
            [gate] = [s for s in run["steps"] if s["key"] == "qa"]
            status, _ = self.call(f"/api/runs/{run_id}/steps/qa/approve", "bob",
                                  {"seen": gate["evidence_digest"]})
            if status == 200:
                self.approved.add(run_id)
            TALLY["HTTP 500s"] += status is not None and status >= 500 and status != 503


def test_postgresql_failover_loses_no_committed_transition(tmp_path):
    pair = PostgresPair(size=ROUNDS + 1)
    consumers, web = [], None
    try:
        pair.start("tollgate")
        wait_for(pair.in_sync, 60, 0.1, what="the standby to stream synchronously")
        log = tmp_path / "attempts.log"
        env = consumer_env(
            DATABASE_URL=pair.url("tollgate"), TOLLGATE_HUEY_NAME=f"failover-{os.getpid()}",
            TOLLGATE_VAR_DIR=str(tmp_path), TOLLGATE_SPOOL_DIR=str(tmp_path / "spool"),
            ALLOWED_HOSTS="127.0.0.1", TOLLGATE_SSL_REDIRECT="0", TOLLGATE_SECURE_COOKIES="0",
            SECRET_KEY="failover-" + "x" * 50, TOLLGATE_LEASE_SECONDS="3")
        manage(env, "manage.py", "migrate", "--noinput")
        spec = {"name": "failover", "steps": [
            {"key": "build", "max_retries": 20, "run": {"shell": logged_shell(log, 0.5)}},
            {"key": "qa", "depends_on": ["build"], "approval": {"group": "qa"}},
            {"key": "ship", "depends_on": ["qa"], "max_retries": 20,
             "run": {"shell": logged_shell(log, 0.3)}}]}
        tokens = json.loads(manage(env, "-m", "tests.faults.remote", "setup", json.dumps(spec)))
        sock = listener()
        port = sock.getsockname()[1]
        web = start_gunicorn(env, sock)
        consumers = [Consumer(workers=2, **env),
                     Consumer(workers=2, container="box" if os.geteuid() == 0 else "", **env)]
        client = Client(port, tokens)
        seen: set[tuple] = set()
        for round_ in range(ROUNDS):
            for index in range(RUNS_PER_ROUND):
                client.start(f"r{round_}-{index}")
                client.approve_waiting()
                time.sleep(0.15)
            # What the primary has committed the moment before it dies.
            seen |= committed(pair.primary)
            pair.crash_primary()
            injected()
            # No primary for a while: requests are refused with 503 and made again.
            for index in range(RUNS_PER_ROUND // 4):
                client.start(f"r{round_}-away-{index}")
                time.sleep(0.3)
            pair.promote()
            # The web server and consumers find the new primary by themselves.
            for index in range(RUNS_PER_ROUND // 4):
                client.start(f"r{round_}-late-{index}")
                client.approve_waiting()
                time.sleep(0.15)
            if round_ + 1 < ROUNDS:
                pair.add_standby()
                wait_for(pair.in_sync, 60, 0.1, what="the new standby to stream")
        # A start that went unanswered is asked again: its idempotency key finds the run if
        # it was made.
        for key in client.keys:
            if key not in client.started:
                wait_for(lambda key=key: client.start(key) or key in client.started, 60, 0.5,
                         what=f"run {key} to be started")
        run_ids = sorted(set(client.started.values()))

        def all_ended():
            client.approve_waiting()
            result = json.loads(manage(env, "-m", "tests.faults.remote", "check", json.dumps(
                {"run_ids": run_ids, "allowed": ["completed"]})))
            return result if all(status == "completed"
                                 for status in result["statuses"].values()) else None

        try:
            result = wait_for(all_ended, 180, 1, what="every run to complete")
        except AssertionError:
            result = json.loads(manage(env, "-m", "tests.faults.remote", "check", json.dumps(
                {"run_ids": run_ids, "allowed": ["completed"]})))
            TALLY["steps stuck"] += sum(status != "completed"
                                        for status in result["statuses"].values())
        print(f"\nfailover: {ROUNDS} promotions, {len(seen)} checkpoints committed before them, "
              f"{client.errors} requests refused or unanswered while they happened")
        now = committed(pair.primary)
        lost = sorted(seen - now)
        lapped = overlaps(log)
        TALLY["runs checked"] += len(run_ids)
        TALLY["results lost"] += len(lost)
        TALLY["overlapping attempts"] += len(lapped)
        TALLY["anomalies found"] += len(result["anomalies"])
        ANOMALIES.extend([f"failover lost checkpoint {row}" for row in lost] + lapped
                         + result["anomalies"])
        assert lost == [] and lapped == [] and result["anomalies"] == [], (
            lost, lapped, result["anomalies"])
        assert len(run_ids) == ROUNDS * RUNS_PER_ROUND * 3 // 2
        assert client.approved >= set(run_ids)
    finally:
        for consumer in consumers:
            consumer.stop()
        if web is not None:
            stop(web, timeout=5)
        pair.close()

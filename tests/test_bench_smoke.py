"""`make bench` cannot rot: every section runs at its smallest size on the database this
suite runs on, and fills its rows (the figures themselves are the bench's, not a test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.plumbing import Bench  # noqa: E402
from bench.report import table  # noqa: E402


def test_every_bench_section_runs_at_its_smallest_size(tmp_path):
    backend = "postgres" if connection.vendor == "postgresql" else "sqlite"
    out = tmp_path / "bench.json"
    # As `make bench` runs from a shell: nothing of this suite's own environment (its
    # consumers may run commands as themselves; a shell's may not).
    env = {k: v for k, v in os.environ.items() if k != "TOLLGATE_COMMANDS_AS_CONSUMER"}
    done = subprocess.run([sys.executable, "bench/run.py", "--size", "smoke", "--only", backend,
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert result.get("failed", {}) == {}, result.get("failed")
    for section in ("floor", "linear", "fan_out", "runs", "fairness", "approval_round_trip_ms",
                    "scaleout", "profile", "pages", "sweeper", "http", "soak", "storage"):
        assert section in result, f"no {section} figures"
    assert set(report["sections"]) == set(Bench.SECTIONS)
    assert result["pages"]["queries_independent_of_size"], result["pages"]
    assert result["pages"]["rollup_matches_runs"]
    assert result["pages"]["progress_matches_runs"]
    assert result["http"]["inbox_polls"]["cards"] > 0
    # Every change reached the open inbox (or the section would have failed saying so).
    assert result["http"]["change_to_open_inbox_ms"]["n"] > 0
    # 500 streams opened and were held; every change reached its stream (or the section
    # would have failed saying so).
    streams = result["http"]["event_streams"]
    assert streams["streams"] == 500 and streams["change_to_open_inbox_ms"]["n"] > 0
    assert result["soak"]["runs_not_completed"] == 0
    # The step path's statements replayed without the engine (the replay checks it left
    # the run as the engine did), and the least an approve does beside approve.
    replay = result["profile"]["replay"]
    assert replay["statements_per_step"] > 1 and replay["as_sent"]["ms_per_step"] > 0
    assert result["http"]["authenticated_write"]["requests"] > 0
    if backend == "postgres":
        rows = result["scaleout"]["rows"]
        assert [(row["consumers"], row["threads"], row["group_commit_steps"])
                for row in rows] == [(1, 2, 8), (2, 2, 8), (2, 2, 1)]
        assert all(row["steps_per_s"] > 0 for row in rows)
        # One step per transaction writes at least one transaction a step. (How many steps
        # a group commit gathers depends on how the backlog arrives: a figure, not a test.)
        assert rows[2]["write_transactions_per_step"] >= 1
        assert replay["one_round_trip"]["round_trips_per_step"] < replay["as_sent"][
            "round_trips_per_step"]
    printed = table([result])
    assert "floor: UPDATE+INSERT transaction ms" in printed

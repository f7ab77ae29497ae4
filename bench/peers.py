"""The DBOS peer: installed by the bench into a venv of its own, run in the same run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.plumbing import PG_ADMIN, ROOT, VAR

DBOS_PEER = ROOT / "bench" / "dbos_peer.py"


def dbos_interpreters() -> list[str]:
    """Interpreters to try for the DBOS peer: BENCH_DBOS_PYTHON, this one, any python3.11
    (DBOS's SQLite schema needs SQLite 3.42, and some builds link an older one)."""
    found = [os.environ.get("BENCH_DBOS_PYTHON", ""), sys.executable,
             str(VAR / "dbos-venv" / "bin" / "python"), shutil.which("python3.11") or ""]
    found += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.11*/bin/python"))
    return [p for p in dict.fromkeys(found) if p and Path(p).exists()]


DBOS_VERSION = "3.4.0"


def sqlite_version(python: str) -> tuple[int, ...]:
    # dbos_peer.py uses pysqlite3 (a recent SQLite) where it is installed.
    probe = ("try:\n import pysqlite3 as s\nexcept ImportError:\n import sqlite3 as s\n"
             "print(s.sqlite_version)")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    try:
        return tuple(int(part) for part in done.stdout.strip().split("."))
    except ValueError:
        return (0,)


def ensure_dbos_peer() -> str:
    """The bench installs its peer itself: when no interpreter has dbos, a venv of its own
    (var/dbos-venv) gets dbos, made from the interpreter whose SQLite is newest (DBOS's
    SQLite schema needs 3.42). Returns what it did, for the report."""
    for python in dbos_interpreters():
        if subprocess.run([python, "-c", "import dbos"], capture_output=True).returncode == 0:
            return f"dbos found in {python}"
    candidates = [p for p in dbos_interpreters() if "dbos-venv" not in p]
    if not candidates:
        return "no interpreter to make a DBOS venv from"
    base = max(candidates, key=sqlite_version)
    venv = VAR / "dbos-venv"
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        return f"could not make a venv from {base}: {made.stderr.strip()[-300:]}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    installed = subprocess.run([*pip, f"dbos=={DBOS_VERSION}", "psycopg[binary]"],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        return f"could not install dbos: {installed.stderr.strip()[-300:]}"
    # A recent SQLite for DBOS's schema, where a wheel exists for this machine.
    subprocess.run([*pip, "pysqlite3-binary"], capture_output=True, timeout=900)
    version = ".".join(map(str, sqlite_version(str(venv / "bin" / "python"))))
    return f"installed dbos {DBOS_VERSION} in {venv} (from {base}; SQLite {version})"


def dbos_peer(backend: str, workload: str, n: int, m: int = 0) -> dict:
    """One DBOS workload (see dbos_peer.py) on a fresh database of the same kind, in the
    first interpreter that has dbos; {"skipped": why} where none does."""
    if backend == "sqlite":
        path = VAR / "bench-dbos.sqlite3"
        for leftover in (path, path.with_suffix(".sqlite3-wal"), path.with_suffix(".sqlite3-shm")):
            leftover.unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    else:
        import psycopg

        with psycopg.connect(PG_ADMIN.replace("postgres://", "postgresql://"),
                             autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS tollgate_bench_dbos WITH (FORCE)")
        url = PG_ADMIN.replace("postgres://", "postgresql://").rsplit("/", 1)[0] + \
            "/tollgate_bench_dbos"
    tried, too_old = [], []
    for python in dbos_interpreters():
        probe = subprocess.run([python, "-c", "import dbos"], capture_output=True)
        if probe.returncode != 0:
            continue
        if backend == "sqlite" and sqlite_version(python) < (3, 42):
            too_old.append(f"{python} has SQLite {'.'.join(map(str, sqlite_version(python)))}")
            continue
        done = subprocess.run([python, str(DBOS_PEER), url, workload, str(n), str(m)],
                              capture_output=True, text=True, timeout=900)
        tried.append(python)
        if done.returncode == 0 and done.stdout.strip():
            return {**json.loads(done.stdout.strip().splitlines()[-1]), "interpreter": python}
    if too_old and not tried:
        return {"skipped": "DBOS's SQLite schema needs SQLite 3.42; " + "; ".join(too_old)}
    return {"skipped": "no interpreter with dbos ran" + (f" (tried {tried})" if tried else
                                                         "; pip install -e '.[bench]'")}

"""Back up a live database (SQLite's online backup, or pg_dump), restore it elsewhere, and
resume its open runs there: the gate that waited is approved and the run completes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from django.db import connection

from tests.support.processes import ROOT
from tests.workflows.helpers import work
from workflows import engine
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.django_db(transaction=True)]

RESUME = """
import django, sys
django.setup()
from django.contrib.auth.models import User
from workflows import engine
from workflows.workers import worker
from workflows.models import Run
run = Run.objects.get(pk=int(sys.argv[1]))
engine.approve(run, "qa", user=User.objects.get(username="bob"), comment="after restore")
for _ in range(10):
    worker.work(budget=5)
print(Run.objects.get(pk=run.pk).status)
"""


def restore(tmp_path) -> tuple[str, callable]:
    """A restored copy of the test database: (its DATABASE_URL, a clean-up)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        copy = tmp_path / "restored.sqlite3"
        source, target = sqlite3.connect(db["NAME"]), sqlite3.connect(copy)
        source.backup(target)  # SQLite's online backup: consistent while others write
        source.close()
        target.close()
        return f"sqlite:///{copy}", lambda: None
    dump = tmp_path / "tollgate.dump"
    where = ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432),
             "-U", db["USER"] or "postgres"]
    restored = f"{db['NAME']}_restored"
    subprocess.run(["pg_dump", *where, "-Fc", "-f", str(dump), db["NAME"]], check=True)
    subprocess.run(["dropdb", *where, "--if-exists", restored], check=True)
    subprocess.run(["createdb", *where, restored], check=True)
    subprocess.run(["pg_restore", *where, "--no-owner", "-d", restored, str(dump)], check=True)
    url = (f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:"
           f"{db['PORT'] or 5432}/{restored}")
    return url, lambda: subprocess.run(["dropdb", *where, "--if-exists", restored])


def test_a_restored_backup_resumes_its_open_runs(release_spec, people, tmp_path):
    store_spec({"name": "restorable", "steps": [
        {"key": "build", "run": {"callable": "workflows.callables.count"}},
        {"key": "qa", "depends_on": ["build"], "approval": {"group": "qa"}},
        {"key": "ship", "depends_on": ["qa"], "run": {"callable": "workflows.callables.count"}},
    ]})
    run = engine.open_run("restorable", actor=people["alice"]).run
    work(run, "build", state_patch={"count": 1})
    url, clean_up = restore(tmp_path)
    try:
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tollgate.settings",
               "DEBUG": "0", "TOLLGATE_DISPATCH": "0", "TOLLGATE_NOTIFY": "0",
               "TOLLGATE_WEBHOOKS": "0", "TOLLGATE_CALLABLES": "workflows.callables.*"}
        done = subprocess.run([sys.executable, "-c", RESUME, str(run.pk)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "completed"
    finally:
        clean_up()
    run.refresh_from_db()
    assert run.status == "waiting_approval"  # the original is untouched

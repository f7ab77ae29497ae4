"""Upgrading with consumers running: the previous release's worker, against this release's
schema (migrated while it may run), still claims, runs and reports steps to the end. Every
column this release adds has a database default, so the old code's inserts still work."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from tests.support.processes import ROOT, stop
from tests.workflows.consumers import consumer_env, wait_for
from workflows import engine
from workflows.models import Checkpoint, Run
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.consumer]

# The last release that landed before this one: its worker must run against this schema.
PREVIOUS_RELEASE = "2015dde"


@pytest.fixture
def previous_release(tmp_path):
    """The previous release's code, from this repository's history."""
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                             capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("needs the repository's history (a full git clone)")
    archive = subprocess.run(["git", "archive", PREVIOUS_RELEASE], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path / "previous", filter="data")
    return tmp_path / "previous"


def test_the_previous_workers_finish_runs_on_the_new_schema(previous_release, tmp_path):
    import sys

    spec = store_spec({"name": "upgrade", "steps": [
        {"key": f"s{i}", "run": {"callable": "workflows.callables.count"},
         **({"depends_on": [f"s{i - 1}"]} if i else {})} for i in range(4)]})[0]
    runs = [engine.open_run(spec).run for _ in range(3)]
    # What earlier tests left queued may name tasks the previous release does not have (it
    # would log that it cannot run them): the queue starts empty, as after a drained upgrade.
    from huey.contrib.djhuey import HUEY

    HUEY.flush()
    log = open(tmp_path / "old-consumer.log", "ab")  # noqa: SIM115
    old = subprocess.Popen([sys.executable, "manage.py", "run_huey", "--workers", "2",
                            "--worker-type", "thread"], cwd=previous_release,
                           env=consumer_env(TOLLGATE_DISPATCH="1"), stdout=log, stderr=log,
                           start_new_session=True)
    try:
        # No doorbell reached it (the runs opened before it started): its sweeper rings.
        wait_for(lambda: all(Run.objects.get(pk=r.pk).status == "completed" for r in runs),
                 90, what="the previous release's worker to finish the runs")
    finally:
        stop(old)
        log.close()
    for run in runs:
        run.refresh_from_db()
        assert run.shared_state == {"count": 4}
        assert run.kind == "" and run.ref == ""  # the new columns' defaults
        assert list(Checkpoint.objects.filter(run=run).values_list("label", flat=True)) == [
            ""] * Checkpoint.objects.filter(run=run).count()
    assert "Traceback" not in (tmp_path / "old-consumer.log").read_text()
    from workflows.models import Worker

    # The old code ran (this release's consumers report themselves; the previous did not).
    assert not (previous_release / "workflows" / "presence.py").exists()
    assert not Worker.objects.exists()

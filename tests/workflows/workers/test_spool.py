"""The spool: each deployment's results its own, a folder judged by whether its holder
still holds it, and nothing deleted that this database cannot account for."""

from __future__ import annotations

import json

import pytest

from workflows import engine
from workflows.engine import processes
from workflows.models import Step
from workflows.specs.storage import store_spec
from workflows.workers import spool, worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed(settings, tmp_path):
    """A command step claimed by this process, as a worker would."""
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    settings.TOLLGATE_DISPATCH = False
    spec = store_spec({"name": "spooled", "steps": [{"key": "work", "run": {"shell": "true"}}]})
    engine.open_run(spec[0])
    return engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())


def finished_folder(base, step: Step, holder: str | None) -> object:
    """A folder as a supervisor leaves it once its command exited 0."""
    folder = base / f"step-{step.pk}-{step.lease_token}"
    (folder / "io").mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"argv": ["true"]}))
    (folder / "result.json").write_text(json.dumps({"exit_code": 0, "stopped": "", "pid": 1}))
    (folder / "stdout").write_text("finished before its worker went\n")
    if holder is not None:
        (folder / "holder.json").write_text(holder)
    return folder


def test_each_database_has_its_own_spool(claimed, settings):
    root = spool.root()
    assert root.parent == spool.Path(settings.TOLLGATE_SPOOL_DIR)
    assert root.name.startswith("db-") and root.name == spool.root().name


def test_another_deployments_folder_is_never_touched(claimed, settings):
    """Two deployments on one spool folder: this one's sweeps neither record nor delete
    what the other's consumers left, even where its step ids are the same."""
    other = spool.Path(settings.TOLLGATE_SPOOL_DIR) / "db-0123456789abcdef"
    folder = finished_folder(other, claimed, holder="{}")
    assert worker.record_orphans(force=True) == 0
    assert folder.exists() and Step.objects.get(pk=claimed.pk).status == "running"


def test_a_folder_naming_no_step_of_this_database_is_left_as_it_is(claimed):
    ghost = Step(pk=claimed.pk + 1000, lease_token="0123abcd")
    folder = finished_folder(spool.root(), ghost, holder="{}")
    assert worker.record_orphans(force=True) == 0
    assert folder.exists()


@pytest.mark.parametrize("holder", ["{not json", "", "[1, 2]"])
def test_a_corrupt_holder_record_blocks_nothing(claimed, holder):
    """A folder from before holder locks whose record cannot be read is judged to have no
    holder: its finished result is recorded (under its lease token) and the folder goes."""
    folder = finished_folder(spool.root(), claimed, holder=holder)
    assert worker.record_orphans(force=True) == 1
    done = Step.objects.get(pk=claimed.pk)
    assert done.status == "completed" and done.attempt == 1
    assert done.last_evidence["stdout"] == "finished before its worker went\n"
    assert not folder.exists()


def test_a_held_folder_is_left_to_its_holder_until_it_lets_go(claimed):
    folder = spool.open_folder({"kind": "step", "id": claimed.pk, "token": claimed.lease_token})
    (folder / "result.json").write_text(json.dumps({"exit_code": 0, "stopped": "", "pid": 1}))
    assert spool.orphans() == []  # held by this process: its own to record
    spool._let_go(folder)  # as when its process ends, however it ends
    assert [f for *_, f in spool.orphans()] == [folder]


def test_a_finished_result_whose_lease_moved_on_is_kept_as_a_stale_result(claimed):
    """A host cut off past the report window comes back with a command that ran to its
    end: its lease was taken back and the step ran again meanwhile, so the result is not
    applied, but it is not lost either: a stale result with its exit code and a digest of
    its output."""
    import hashlib
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import Checkpoint

    Step.objects.filter(pk=claimed.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    old = Step.objects.get(pk=claimed.pk)
    engine.expire_lease(old.pk)  # the lease moved on (retried, then run again elsewhere)
    folder = finished_folder(spool.root(), old, holder="{}")
    assert worker.record_orphans(force=True) == 1
    stale = Checkpoint.objects.get(step=old, kind="stale_result")
    assert stale.evidence["token"] == old.lease_token and stale.evidence["exit_code"] == 0
    assert stale.evidence["output_sha256"] == hashlib.sha256(
        b"finished before its worker went\n").hexdigest()
    assert "lease moved on" in stale.actor_name and not folder.exists()
    assert Step.objects.get(pk=old.pk).status == "failed"  # no retry left; never applied

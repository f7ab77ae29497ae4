"""Bad output and local errors end an attempt with a clear error; nothing is left running."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from workflows import engine
from workflows.engine import processes
from workflows.models import Step
from workflows.specs.storage import store_spec
from workflows.workers import spool, worker
from workflows.workers.executors import run_process

CONTEXT = {"run_id": 1, "step_key": "s", "attempt": 1}


def run(shell):
    return run_process({"shell": shell}, context=CONTEXT, shared_state={},
                       stop=threading.Event(), grace=1.0)


def test_nul_bytes_in_output_are_kept_as_replacement_characters():
    outcome = run(r"printf 'a\000b'; printf 'c\000d' >&2")
    assert outcome.ok and outcome.evidence["stdout"] == "a\ufffdb"
    assert outcome.evidence["stderr"] == "c\ufffdd"


@pytest.mark.parametrize("patch, problem", [
    (r"""printf '{"x": "\377"}'""", "not UTF-8"),
    (r"""printf '%s' '{"x": "a\u0000b"}'""", "NUL characters"),
    ("""printf '{"x": NaN}'""", "not a finite number"),
    ("printf '[1]'", "must hold a JSON object"),
    ("ln -s /etc/passwd", "symbolic link"),
])
def test_a_bad_state_patch_fails_the_attempt_saying_why(patch, problem):
    target = '"$TOLLGATE_STATE_PATCH_FILE"'
    outcome = run(f"{patch} {target}" if patch.startswith("ln") else f"{patch} > {target}")
    assert not outcome.ok and problem in outcome.summary


@pytest.mark.django_db
def test_output_the_database_refuses_never_leaves_a_step_running(settings, tmp_path):
    settings.TOLLGATE_SPOOL_DIR = str(tmp_path / "spool")
    spec = store_spec({"name": "noisy", "steps": [
        {"key": "s", "run": {"shell": r"""printf 'x\000y'; printf '{"k": "\377"}' """
                                      '> "$TOLLGATE_STATE_PATCH_FILE"'}}]})[0]
    run = engine.open_run(spec).run
    step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
    checkpoint = worker._execute_one(step, "w", chain=False)
    assert checkpoint.kind == "step_failed" and "not UTF-8" in checkpoint.summary
    assert Step.objects.get(run=run).status == "failed"
    assert os.listdir(spool.root()) == []


@pytest.mark.django_db
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_ends_the_attempt_and_the_next_one_runs_once_space_returns(settings,
                                                                               tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        settings.TOLLGATE_SPOOL_DIR = str(small / "spool")
        filler = small / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=64"],
                       capture_output=True)
        spec = store_spec({"name": "full", "steps": [
            {"key": "s", "run": {"command": ["echo", "ok"]}, "max_retries": 1}]})[0]
        run = engine.open_run(spec, shared_state={"big": "x" * 20_000}).run
        step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
        checkpoint = worker._execute_one(step, "w", chain=False)
        assert checkpoint.kind == "step_retrying"
        assert "No space left" in checkpoint.summary
        filler.unlink()  # space returns
        Step.objects.filter(run=run).update(retry_after=None)
        step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
        assert worker._execute_one(step, "w", chain=False).kind == "step_completed"
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)

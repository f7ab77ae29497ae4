"""Executors: no shell unless asked, timeouts kill the process group, output capped and redacted."""

from __future__ import annotations

import json
import os
import threading

import pytest

from workflows.workers.executors import CappedBuffer, execute, fence_of, run_process

CONTEXT = {"run_id": 7, "step_key": "build", "attempt": 2}


def run(action, state=None, stop=None, grace=1.0):
    return run_process(action, context=CONTEXT, shared_state=state or {},
                       stop=stop or threading.Event(), grace=grace)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_command_runs_without_a_shell():
    outcome = run({"command": ["echo", "$HOME", ";", "rm", "-rf", "/"]})
    assert outcome.ok and outcome.evidence["stdout"] == "$HOME ; rm -rf /\n"


def test_shell_is_explicit():
    outcome = run({"shell": "echo one two | wc -w"})
    assert outcome.ok and outcome.evidence["stdout"].strip() == "2"


def test_environment_state_file_and_patch(tmp_path):
    script = ('echo "$TOLLGATE_RUN_ID $TOLLGATE_STEP_KEY $TOLLGATE_ATTEMPT $GREETING"; '
              'cat "$TOLLGATE_STATE_FILE"; echo \'{"built": true}\' > "$TOLLGATE_STATE_PATCH_FILE"')
    outcome = run({"shell": script, "env": {"GREETING": "hi"}, "cwd": str(tmp_path)},
                  state={"branch": "main"})
    lines = outcome.evidence["stdout"].splitlines()
    assert lines[0] == "7 build 2 hi" and json.loads(lines[1]) == {
        "branch": "main",
        "tollgate": {"fencing_scope": "run/7/step/build", "fencing_token": 2}}
    assert outcome.state_patch == {"built": True}


def test_a_command_gets_its_fencing_token(tmp_path):
    """What a resource needs to refuse a stale attempt: the scope, a token that grows with
    each attempt, and the lease token, in the environment and the state file."""
    outcome = run_process(
        {"shell": 'echo "$TOLLGATE_FENCING_SCOPE $TOLLGATE_FENCING_TOKEN"'},
        context={**CONTEXT, "attempt": 3, "compensating": True},
        shared_state={}, stop=threading.Event(), grace=1.0)
    assert outcome.evidence["stdout"] == "run/7/compensation/build 3\n"
    leased = {**CONTEXT, "lease": {"kind": "step", "id": 4, "token": "abcdef0123"}}
    assert fence_of(leased) == {"fencing_scope": "run/7/step/build", "fencing_token": 2,
                                "lease_token": "abcdef0123"}


def test_bad_patch_file_fails_the_step():
    outcome = run({"shell": 'echo "not json" > "$TOLLGATE_STATE_PATCH_FILE"'})
    assert not outcome.ok and "not valid JSON" in outcome.summary


def test_nonzero_exit_fails_with_status():
    outcome = run({"command": ["sh", "-c", "echo oops >&2; exit 3"]})
    assert not outcome.ok and outcome.evidence["exit_code"] == 3
    assert outcome.evidence["stderr"] == "oops\n" and "status 3" in outcome.summary


def test_missing_program():
    outcome = run({"command": ["no-such-program-xyz"]})
    assert not outcome.ok and "Could not start" in outcome.summary


def test_timeout_kills_the_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    # Left alone the group would last 900 s; the outcome says it timed out, and both are gone.
    outcome = run({"shell": f"sleep 900 & echo $! > {pids}; echo $$ >> {pids}; wait",
                   "timeout_seconds": 0.5})
    assert not outcome.ok and outcome.evidence["timed_out"] and "Timed out" in outcome.summary
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid)


def test_a_command_ignoring_sigterm_gets_sigkill(tmp_path):
    pid_file = tmp_path / "pid"
    # The loop never ends on its own: the outcome coming back at all is SIGKILL's doing.
    outcome = run({"shell": f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.1; done",
                   "timeout_seconds": 0.5}, grace=0.5)
    assert outcome.evidence["timed_out"]
    assert not alive(int(pid_file.read_text()))


def test_stop_event_terminates(tmp_path):
    """Stopped once the command runs (a timer could fire before it began on a busy machine:
    that is a stop before the command, recorded as such)."""
    stop, began = threading.Event(), tmp_path / "began"

    def stop_once_begun():
        while not began.exists() and not stop.wait(0.01):
            pass
        stop.set()

    threading.Thread(target=stop_once_begun, daemon=True).start()
    outcome = run({"shell": f"touch {began}; sleep 30"}, stop=stop)
    assert not outcome.ok and outcome.evidence["terminated"] and not outcome.retryable


def test_output_over_the_cap_keeps_head_and_tail(settings):
    settings.TOLLGATE_OUTPUT_CAP = 1000
    outcome = run({"shell": "echo START; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END"})
    out = outcome.evidence["stdout"]
    assert out.startswith("START") and out.rstrip().endswith("END")
    assert "bytes cut by Tollgate's output cap" in out and len(out) < 1200
    assert outcome.evidence["stdout_bytes"] > 200000


def test_capped_buffer_counts_what_it_cut():
    buffer = CappedBuffer(10)
    for chunk in [b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"]:
        buffer.write(chunk)
    assert buffer.text() == "abcde\n[... 16 bytes cut by Tollgate's output cap ...]\nvwxyz"


def test_secrets_are_redacted_from_output(settings):
    settings.TOLLGATE_REDACT_ENV = ["DEPLOY_HOOK"]
    outcome = run({"shell": 'echo "$DB_PASSWORD $DEPLOY_HOOK $PLAIN" >&2',
                   "env": {"DB_PASSWORD": "hunter2hunter2", "DEPLOY_HOOK": "https://hook/x1",
                           "PLAIN": "visible"}})
    assert outcome.evidence["stderr"] == "[redacted] [redacted] visible\n"


def test_commands_get_a_clean_environment(settings, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_supersecret123")
    monkeypatch.setenv("WORKER_ONLY", "not-for-steps")
    monkeypatch.setenv("TZ", "Europe/Paris")
    settings.TOLLGATE_COMMAND_ENV = ["PATH", "TZ"]
    outcome = run({"command": ["env"], "env": {"FROM_SPEC": "yes"}})
    seen = dict(line.split("=", 1) for line in outcome.evidence["stdout"].splitlines())
    assert seen["FROM_SPEC"] == "yes" and seen["TZ"] == "Europe/Paris" and "PATH" in seen
    assert "GITHUB_TOKEN" not in seen and "WORKER_ONLY" not in seen
    assert {name for name in seen if not name.startswith("TOLLGATE_")} == {
        "PATH", "TZ", "FROM_SPEC"}


def test_values_of_secret_settings_are_redacted(settings, monkeypatch):
    settings.SECRET_KEY = "the-signing-key-of-this-site"
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_supersecret123")
    outcome = run({"shell": 'echo "the-signing-key-of-this-site"; echo ghp_supersecret123'})
    assert outcome.evidence["stdout"] == "[redacted]\n[redacted]\n"


def test_callable_returns_state_patch(settings):
    outcome = execute({"callable": "workflows.callables.count"}, context=CONTEXT,
                      shared_state={"count": 4}, stop=threading.Event())
    assert outcome.ok and outcome.state_patch == {"count": 5}


def test_callable_exception_fails_with_traceback():
    outcome = execute({"callable": "workflows.callables.fail"}, context=CONTEXT,
                      shared_state={}, stop=threading.Event())
    assert not outcome.ok and "failed on purpose" in outcome.summary
    assert "Traceback" in outcome.evidence["traceback"]


def test_callable_off_the_allow_list_is_refused(settings):
    outcome = execute({"callable": "os.getcwd"}, context=CONTEXT, shared_state={},
                      stop=threading.Event())
    assert not outcome.ok and "allow-list" in outcome.summary


@pytest.mark.parametrize("path", ["workflows.callables.noop", "workflows.callables.sleep"])
def test_allow_list_wildcard_covers_module_functions(path):
    from workflows.specs.validation import callable_allowed

    assert callable_allowed(path)
    assert not callable_allowed("workflows.callables_evil.noop")
    assert not callable_allowed("workflows.callables.sub.noop")


@pytest.mark.django_db(transaction=True)
def test_a_command_knows_its_spec_schedule_slot_and_parent_run(release_spec, people):
    """From the run itself: a scheduled run's schedule and slot, a child's parent run and
    step, and every run's spec, in the environment and under "tollgate" in the state file."""
    from datetime import UTC, datetime

    from tests.workflows.test_children import CHILD, parent_spec, work_all
    from workflows import engine
    from workflows.models import Run, Schedule
    from workflows.specs.storage import store_spec
    from workflows.timing import schedules
    from workflows.workers.worker import origin

    slot = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    item = Schedule.objects.create(name="nightly", spec_name="release", cron="",
                                   interval_seconds=3600, next_run_at=slot)
    schedules.tick(slot)
    scheduled = Run.objects.get(idempotency_key__startswith="schedule:")
    store_spec(CHILD)
    parent = engine.open_run(parent_spec(), actor=people["alice"], params={"version": "1"}).run
    work_all()
    child = Run.objects.get(parent_step__run=parent)
    script = ('echo "$TOLLGATE_SPEC|$TOLLGATE_SCHEDULE_ID|$TOLLGATE_SCHEDULE|$TOLLGATE_SLOT|'
              '$TOLLGATE_PARENT_RUN_ID|$TOLLGATE_PARENT_STEP_KEY"; cat "$TOLLGATE_STATE_FILE"')
    for run_, line, tollgate in [
        (scheduled, f"release|{item.pk}|nightly|{slot.isoformat()}||",
         {"spec": "release", "schedule": str(item.pk), "schedule_name": "nightly",
          "slot": slot.isoformat()}),
        (child, f"child||||{parent.pk}|sub",
         {"spec": "child", "parent_run": parent.pk, "parent_step": "sub"}),
    ]:
        outcome = run_process({"shell": script}, context={**CONTEXT, **origin(run_)},
                              shared_state={}, stop=threading.Event(), grace=1.0)
        lines = outcome.evidence["stdout"].splitlines()
        assert lines[0] == line
        state = json.loads(lines[1])["tollgate"]
        assert {k: v for k, v in state.items() if not k.startswith("fencing")} == tollgate


@pytest.mark.parametrize("asked", ["fenced", "cancelled", "timed_out"])
def test_a_command_that_ended_by_itself_is_judged_by_its_exit_code(tmp_path, asked):
    """The worker gave up its lease (or timed out) just as the command finished: the
    supervisor reaped the exit before it stopped anything, so the exit code stands."""
    from workflows.workers.executors import outcome_of

    (tmp_path / "io").mkdir()
    (tmp_path / "reason").write_text(asked)
    (tmp_path / "stdout").write_text("deployed\n")
    (tmp_path / "io" / "state_patch.json").write_text('{"deployed": true}')
    (tmp_path / "result.json").write_text(json.dumps(
        {"exit_code": 0, "signal": None, "stopped": "", "pid": 1, "pgid": 1}))
    outcome = outcome_of(tmp_path, [])
    assert outcome.ok and outcome.state_patch == {"deployed": True}
    assert outcome.evidence["stop_requested"] == asked
    # One that the supervisor did stop is the worker's reason, as before.
    (tmp_path / "result.json").write_text(json.dumps(
        {"exit_code": None, "signal": 15, "stopped": "stopped", "pid": 1, "pgid": 1}))
    assert not outcome_of(tmp_path, []).ok

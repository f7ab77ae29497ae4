"""Running a step's action: a command (argv, no shell), a shell line, or a callable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from .params import env_name
from .specs import allowed_callable

SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
REDACTED = "[redacted]"


@dataclass
class Outcome:
    ok: bool
    summary: str
    evidence: dict = field(default_factory=dict)
    state_patch: dict = field(default_factory=dict)
    retryable: bool = True


class CappedBuffer:
    """Keeps the head and tail of a stream, counting what was cut from the middle."""

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_size += len(data)
            while self.tail_size - len(self.tail[0]) >= self.half:
                self.tail_size -= len(self.tail.popleft())

    def text(self) -> str:
        tail = b"".join(self.tail)[-self.half:] if self.tail else b""
        cut = self.total - len(self.head) - len(tail)
        head = self.head.decode("utf-8", "replace")
        if cut <= 0:
            return head + tail.decode("utf-8", "replace")
        return (f"{head}\n[... {cut} bytes cut by Tollgate's output cap ...]\n"
                f"{tail.decode('utf-8', 'replace')}")


def _settings_secrets() -> set[str]:
    """Values of the secret settings: the signing key, database, mail and Redis passwords."""
    from urllib.parse import urlsplit

    values = {settings.SECRET_KEY}
    values.update(db.get("PASSWORD") or "" for db in settings.DATABASES.values())
    for mailer in getattr(settings, "MAILERS", {}).values():
        values.add(mailer.get("OPTIONS", {}).get("password") or "")
    if getattr(settings, "REDIS_URL", ""):
        values.add(urlsplit(settings.REDIS_URL).password or "")
    return values


def secret_values(env: dict[str, str]) -> list[str]:
    """What to redact: secret settings, the worker's secret-looking variables (a callable
    could print them) and those of `env`, and any listed in TOLLGATE_REDACT_ENV."""
    extra = {name.upper() for name in settings.TOLLGATE_REDACT_ENV}
    values = _settings_secrets() | {
        value for name, value in {**os.environ, **env}.items()
        if any(marker in name.upper() for marker in SECRET_MARKERS) or name.upper() in extra
    }
    values = {value for value in values if value and len(value) >= 4}
    return sorted(values, key=len, reverse=True)  # longest first: no partial leftovers


def redact(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


def command_env(action: dict, context: dict, state_file: Path, patch_file: Path) -> dict:
    """A clean environment: allow-listed worker variables, the spec's env, Tollgate's own."""
    base = {name: os.environ[name] for name in settings.TOLLGATE_COMMAND_ENV
            if name in os.environ}
    params = {env_name(name): value if isinstance(value, str) else json.dumps(value)
              for name, value in (context.get("params") or {}).items()}
    return {**base, **action.get("env", {}), **params,
            "TOLLGATE_RUN_ID": str(context["run_id"]),
            "TOLLGATE_STEP_KEY": context["step_key"],
            "TOLLGATE_ATTEMPT": str(context["attempt"]),
            "TOLLGATE_STATE_FILE": str(state_file),
            "TOLLGATE_STATE_PATCH_FILE": str(patch_file)}


SUPERVISOR = Path(__file__).with_name("supervise.py")


def read_capped(path: Path, cap: int) -> tuple[str, int]:
    """(head and tail of a file within `cap` bytes, with a marker for what was cut; its size)."""
    buffer = CappedBuffer(cap)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > cap:  # skip the middle instead of reading it
                buffer.write(handle.read(buffer.half))
                handle.seek(size - buffer.half)
                buffer.total = size - buffer.half
            for chunk in iter(lambda: handle.read(1 << 16), b""):
                buffer.write(chunk)
    except FileNotFoundError:
        return "", 0
    return buffer.text(), buffer.total


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_process(action: dict, *, context: dict, shared_state: dict, stop: threading.Event,
                grace: float | None = None, on_spawn=None) -> Outcome:
    """Run a command or shell step under a supervisor, to completion, timeout or stop.

    The supervisor (`supervise.py`) holds the read end of a pipe whose write end only this
    process holds: if this process dies, by any signal, the command's whole process tree is
    killed. When the command ends or is stopped, nothing it started outlives it. Output goes
    to files, so a grandchild that keeps stdout open cannot hold the step open.
    `on_spawn(pid, pgid)` is called once the command has started.
    """
    grace = settings.TOLLGATE_KILL_GRACE_SECONDS if grace is None else grace
    cap = settings.TOLLGATE_OUTPUT_CAP
    with tempfile.TemporaryDirectory(prefix="tollgate-") as tmp:
        work = Path(tmp)
        state_file, patch_file = work / "state.json", work / "state_patch.json"
        # The run's shared state, and its params (read-only) under "params" when it has any.
        params = context.get("params")
        state_file.write_text(json.dumps({**shared_state, "params": params} if params
                                         else shared_state))
        secrets = secret_values(action.get("env", {}))
        argv = ["/bin/sh", "-c", action["shell"]] if "shell" in action else action["command"]
        (work / "spec.json").write_text(json.dumps({
            "argv": argv, "cwd": action.get("cwd") or None,
            "env": command_env(action, context, state_file, patch_file)}))
        lifeline, keep = os.pipe()
        try:
            supervisor = subprocess.Popen(
                [sys.executable, "-I", str(SUPERVISOR), str(lifeline), tmp, str(grace)],
                pass_fds=(lifeline,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(lifeline)
        try:
            reason = _wait(supervisor, work, action.get("timeout_seconds"), stop, on_spawn)
        finally:
            os.close(keep)
        result = _read_json(work / "result.json") or {}
        if result.get("error") and result.get("exit_code") is None and "pid" not in result:
            return Outcome(False, redact(f"Could not start {argv[0]!r}: {result['error']}",
                                         secrets), {"argv": [redact(a, secrets) for a in argv]})
        stdout, stdout_bytes = read_capped(work / "stdout", cap)
        stderr, stderr_bytes = read_capped(work / "stderr", cap)
        evidence = {
            "exit_code": result.get("exit_code"),
            "stdout": redact(stdout, secrets), "stderr": redact(stderr, secrets),
            "stdout_bytes": stdout_bytes, "stderr_bytes": stderr_bytes,
            "pid": result.get("pid"), "pgid": result.get("pgid"),
        }
        if result.get("signal"):
            evidence["signal"] = result["signal"]
        if reason == "timed_out":
            evidence["timed_out"] = True
            return Outcome(False, f"Timed out after {action['timeout_seconds']}s; process "
                                  "tree terminated", evidence)
        if reason:
            evidence["terminated"] = reason
            return Outcome(False, STOP_SUMMARIES.get(reason, STOP_SUMMARIES["stopped"]),
                           evidence, retryable=reason == "fenced")
        if result.get("exit_code") != 0:
            how = (f"signal {result['signal']}" if result.get("signal")
                   else f"status {result.get('exit_code')}")
            return Outcome(False, f"Exited with {how}", evidence)
        patch = {}
        if patch_file.exists() and patch_file.read_text().strip():
            try:
                patch = json.loads(patch_file.read_text())
            except json.JSONDecodeError as exc:
                return Outcome(False, f"State patch file is not valid JSON: {exc}", evidence)
            if not isinstance(patch, dict):
                return Outcome(False, "State patch file must hold a JSON object", evidence)
        return Outcome(True, "Exited with status 0", evidence, patch)


STOP_SUMMARIES = {
    "stopped": "Stopped: the step was cancelled or its lease was lost",
    "fenced": "Stopped: the lease could not be renewed before it ran out (worker fenced)",
}


def _wait(supervisor: subprocess.Popen, work: Path, timeout, stop, on_spawn) -> str:
    """Wait for the supervisor; ask it to stop the command on timeout or `stop`. Returns
    why the command was stopped ("" if it ended by itself)."""
    deadline = time.monotonic() + timeout if timeout else None
    reason, spawned = "", False
    while supervisor.poll() is None:
        if not spawned and on_spawn and (child := _read_json(work / "child.json")):
            spawned = True
            on_spawn(child["pid"], child["pgid"])
        if not reason:
            if stop.is_set():
                reason = getattr(stop, "reason", "") or "stopped"
            elif deadline and time.monotonic() >= deadline:
                reason = "timed_out"
            if reason:
                supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=0.02 if not spawned else 0.1)
        except subprocess.TimeoutExpired:
            pass
    return reason


def run_callable(action: dict, *, context: dict, shared_state: dict) -> Outcome:
    """Call an allow-listed function with the step's context; a dict it returns is a patch."""
    path = action["callable"]
    func = allowed_callable(path)
    if func is None:
        return Outcome(False, f"Callable {path!r} is not on the allow-list", retryable=False)
    try:
        result = func({"params": {}, **context, "shared_state": dict(shared_state),
                       "config": action})
    except Exception as exc:
        secrets = secret_values(action.get("env", {}))  # only when there is output to redact
        return Outcome(False, redact(f"{type(exc).__name__}: {exc}", secrets),
                       {"traceback": redact(traceback.format_exc(limit=8), secrets)})
    if result is not None and not isinstance(result, dict):
        return Outcome(False, f"{path} returned {type(result).__name__}, not a dict or None")
    return Outcome(True, f"{path} returned", {}, result or {})


def execute(action: dict, *, context: dict, shared_state: dict, stop: threading.Event,
            on_spawn=None) -> Outcome:
    """Run any action, as the spec describes it."""
    if "callable" in action:
        return run_callable(action, context=context, shared_state=shared_state)
    return run_process(action, context=context, shared_state=shared_state, stop=stop,
                       on_spawn=on_spawn)

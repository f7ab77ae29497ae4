"""Running a step's action: a command (argv, no shell), a shell line, or a callable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.utils.module_loading import import_string

from .specs import callable_allowed

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
    return {**base, **action.get("env", {}),
            "TOLLGATE_RUN_ID": str(context["run_id"]),
            "TOLLGATE_STEP_KEY": context["step_key"],
            "TOLLGATE_ATTEMPT": str(context["attempt"]),
            "TOLLGATE_STATE_FILE": str(state_file),
            "TOLLGATE_STATE_PATCH_FILE": str(patch_file)}


def _pump(stream, buffer: CappedBuffer) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        buffer.write(chunk)
    stream.close()


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left after `grace` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also reaps children that outlived the leader
    except ProcessLookupError:
        pass
    proc.wait()


def run_process(action: dict, *, context: dict, shared_state: dict, stop: threading.Event,
                grace: float | None = None) -> Outcome:
    """Run a command or shell step to completion, timeout or stop; capture its output."""
    grace = settings.TOLLGATE_KILL_GRACE_SECONDS if grace is None else grace
    cap = settings.TOLLGATE_OUTPUT_CAP
    with tempfile.TemporaryDirectory(prefix="tollgate-") as tmp:
        state_file = Path(tmp, "state.json")
        patch_file = Path(tmp, "state_patch.json")
        state_file.write_text(json.dumps(shared_state))
        secrets = secret_values(action.get("env", {}))
        env = command_env(action, context, state_file, patch_file)
        argv = ["/bin/sh", "-c", action["shell"]] if "shell" in action else action["command"]
        try:
            proc = subprocess.Popen(
                argv, cwd=action.get("cwd") or None, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            return Outcome(False, redact(f"Could not start {argv[0]!r}: {exc.strerror}", secrets),
                           {"argv": [redact(a, secrets) for a in argv]})
        out, err = CappedBuffer(cap), CappedBuffer(cap)
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True)]
        for pump in pumps:
            pump.start()
        timeout = action.get("timeout_seconds")
        deadline = time.monotonic() + timeout if timeout else None
        reason = ""
        while proc.poll() is None:
            if stop.is_set():
                reason = "stopped"
                break
            if deadline and time.monotonic() >= deadline:
                reason = "timed_out"
                break
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if reason:
            _stop_group(proc, grace)
        for pump in pumps:
            pump.join(timeout=5)
        evidence = {
            "exit_code": proc.returncode,
            "stdout": redact(out.text(), secrets),
            "stderr": redact(err.text(), secrets),
            "stdout_bytes": out.total,
            "stderr_bytes": err.total,
        }
        if reason == "timed_out":
            evidence["timed_out"] = True
            return Outcome(False, f"Timed out after {timeout}s; process group terminated",
                           evidence)
        if reason == "stopped":
            evidence["terminated"] = True
            return Outcome(False, "Stopped: the step was cancelled or its lease was lost",
                           evidence, retryable=False)
        if proc.returncode != 0:
            return Outcome(False, f"Exited with status {proc.returncode}", evidence)
        patch = {}
        if patch_file.exists() and patch_file.read_text().strip():
            try:
                patch = json.loads(patch_file.read_text())
            except json.JSONDecodeError as exc:
                return Outcome(False, f"State patch file is not valid JSON: {exc}", evidence)
            if not isinstance(patch, dict):
                return Outcome(False, "State patch file must hold a JSON object", evidence)
        return Outcome(True, "Exited with status 0", evidence, patch)


def run_callable(action: dict, *, context: dict, shared_state: dict) -> Outcome:
    """Call an allow-listed function with the step's context; a dict it returns is a patch."""
    path = action["callable"]
    if not callable_allowed(path):
        return Outcome(False, f"Callable {path!r} is not on the allow-list", retryable=False)
    secrets = secret_values(action.get("env", {}))
    try:
        func = import_string(path)
        result = func({**context, "shared_state": dict(shared_state), "config": action})
    except Exception as exc:
        return Outcome(False, redact(f"{type(exc).__name__}: {exc}", secrets),
                       {"traceback": redact(traceback.format_exc(limit=8), secrets)})
    if result is not None and not isinstance(result, dict):
        return Outcome(False, f"{path} returned {type(result).__name__}, not a dict or None")
    return Outcome(True, f"{path} returned", {}, result or {})


def execute(action: dict, *, context: dict, shared_state: dict, stop: threading.Event) -> Outcome:
    """Run any action, as the spec describes it."""
    if "callable" in action:
        return run_callable(action, context=context, shared_state=shared_state)
    return run_process(action, context=context, shared_state=shared_state, stop=stop)

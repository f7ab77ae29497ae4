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

from workflows.specs import grants
from workflows.specs.params import env_name
from workflows.specs.validation import allowed_callable
from workflows.specs.values import BadValue, as_is, check_json, fill
from workflows.workers import accounts, agents, redaction, spool


@dataclass
class Outcome:
    ok: bool
    summary: str
    evidence: dict = field(default_factory=dict)
    state_patch: dict = field(default_factory=dict)
    retryable: bool = True
    spooled: Path | None = None  # the attempt's folder, kept until its result is recorded


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
        """The kept bytes as text: invalid UTF-8 and NUL (which no database column takes)
        become U+FFFD."""
        return self._text().replace("\x00", "\ufffd")

    def _text(self) -> str:
        tail = b"".join(self.tail)[-self.half:] if self.tail else b""
        cut = self.total - len(self.head) - len(tail)
        head = self.head.decode("utf-8", "replace")
        if cut <= 0:
            return head + tail.decode("utf-8", "replace")
        return (f"{head}\n[... {cut} bytes cut by Tollgate's output cap ...]\n"
                f"{tail.decode('utf-8', 'replace')}")


def secret_values(env: dict[str, str]) -> list[str]:
    """What to redact: every secret this worker knows (redaction.known_secrets) and the
    secret-looking variables of a step's `env` (or those TOLLGATE_REDACT_ENV names)."""
    return redaction.known_secrets(
        value for name, value in env.items() if redaction.looks_secret(name))


class MissingSecret(Exception):
    """A spec names a secret this worker cannot find."""


def secret_value(name: str) -> str:
    """A named secret, from the worker's environment (TOLLGATE_SECRET_<NAME>) or a file
    named NAME in TOLLGATE_SECRETS_DIR: sources the operator controls, read on the worker."""
    variable = "TOLLGATE_SECRET_" + "".join(c if c.isalnum() else "_" for c in name).upper()
    if variable in os.environ:
        return os.environ[variable]
    folder = settings.TOLLGATE_SECRETS_DIR
    if folder and (value := redaction.read_secret(Path(folder) / name)) is not None:
        return value
    raise MissingSecret(f"Secret {name!r} is not set on this worker ({variable}, or a file "
                        f"named {name} in TOLLGATE_SECRETS_DIR)")


def named_secrets(action: dict, env: dict[str, str]) -> list[str]:
    """The values `env` took from the action's {"secret": NAME} entries."""
    return [env[name] for name, value in (action.get("env") or {}).items()
            if isinstance(value, dict) and name in env]


def resolved_env(action: dict, spec: str | None = None) -> dict[str, str]:
    """The spec's env with each {"secret": NAME} replaced by its value (MissingSecret when
    the worker has no such secret, or when it is not granted to `spec`; None: the caller
    only wants what to redact)."""
    env = {}
    for name, value in (action.get("env") or {}).items():
        if isinstance(value, dict):
            if spec is not None and not grants.granted(spec, value["secret"]):
                raise MissingSecret(f"env {name}: {grants.refusal(spec, value['secret'])}")
            value = secret_value(value["secret"])
        env[name] = value
    return env


def command_env(context: dict, state_file: Path, patch_file: Path,
                env: dict[str, str]) -> dict:
    """A clean environment: allow-listed worker variables, the spec's env (secrets resolved),
    Tollgate's own."""
    base = {name: os.environ[name] for name in settings.TOLLGATE_COMMAND_ENV
            if name in os.environ}
    params = {env_name(name): value if isinstance(value, str) else json.dumps(value)
              for name, value in (context.get("params") or {}).items()}
    fence = {f"TOLLGATE_{name.upper()}": str(value) for name, value in fence_of(context).items()}
    origin = {f"TOLLGATE_{ORIGIN_ENV[name]}": str(value)
              for name, value in origin_of(context).items()}
    return {**base, **env, **params, **origin,
            "TOLLGATE_RUN_ID": str(context["run_id"]),
            "TOLLGATE_STEP_KEY": context["step_key"],
            "TOLLGATE_ATTEMPT": str(context["attempt"]),
            **fence,
            "TOLLGATE_STATE_FILE": str(state_file),
            "TOLLGATE_STATE_PATCH_FILE": str(patch_file)}


# Where a run came from, as a command reads it: TOLLGATE_SPEC, TOLLGATE_SCHEDULE_ID, ...
ORIGIN_ENV = {"spec": "SPEC", "schedule": "SCHEDULE_ID", "schedule_name": "SCHEDULE",
              "slot": "SLOT",
              "parent_run": "PARENT_RUN_ID", "parent_step": "PARENT_STEP_KEY"}


def origin_of(context: dict) -> dict:
    """The run's spec, and the schedule and slot or the parent run and step that started it
    (those it has)."""
    return {name: context[name] for name in ORIGIN_ENV if context.get(name) not in (None, "")}


def fence_of(context: dict) -> dict:
    """What lets the systems a command writes to refuse a stale attempt: the fencing token
    grows with each attempt within its scope (a run's step, or its compensation), so a
    resource that keeps the highest token it has seen per scope and refuses lower ones is
    never written by an attempt that was frozen past its lease and thawed. The lease token
    names this attempt's lease."""
    kind = "compensation" if context.get("compensating") else "step"
    fence = {"fencing_scope": f"run/{context['run_id']}/{kind}/{context['step_key']}",
             "fencing_token": context["attempt"]}
    if context.get("lease"):
        fence["lease_token"] = context["lease"]["token"]
    return fence


SUPERVISOR = Path(__file__).with_name("supervise.py")


class Lifeline:
    """The write end of a supervisor's lifeline: held open while the worker lives; each
    renewal of the lease writes the new fence time on it. Writable from the lease keeper's
    thread while the worker's thread may close it."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.lock = threading.Lock()

    def fence(self, at: float) -> None:
        with self.lock:
            if self.fd is None:
                return
            try:
                os.write(self.fd, f"{at:.3f}\n".encode())
            except OSError:
                pass  # the supervisor has gone; its result says why

    def close(self) -> None:
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


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
    try:
        env = resolved_env(action, context.get("spec", ""))
        account = accounts.environment(action.get("account"), context.get("provider"))
    except (MissingSecret, accounts.AccountError) as exc:
        return Outcome(False, str(exc))
    env = {**env, **account}
    # Redacted by value whatever their names: the account's and the named secrets'.
    hidden = [value for value in [*account.values(), *named_secrets(action, env)]
              if len(value) >= redaction.SHORTEST]
    try:
        user = command_user()
    except KeyError:
        return Outcome(False, f"TOLLGATE_COMMAND_USER {settings.TOLLGATE_COMMAND_USER!r} is "
                              "not an account on this worker")
    lease = context.get("lease")
    try:
        work = spool.open_folder(lease) if lease else Path(tempfile.mkdtemp(prefix="tollgate-"))
    except OSError as exc:
        return Outcome(False, f"Could not make the attempt's folder: {exc.strerror or exc}")
    try:
        outcome = _run_in(work, action, env, user, context, shared_state, stop, grace, cap,
                          on_spawn, hidden)
    except OSError as exc:  # a full or broken disk: the attempt ends, saying so
        outcome = Outcome(False, f"Could not prepare or read the command's files: "
                                 f"{exc.strerror or exc}")
    if action.get("account"):  # which account, never its values
        outcome.evidence["account"] = accounts.described(action["account"],
                                                         context.get("provider"))
    if lease and (work / "result.json").exists():
        outcome.spooled = work  # kept until the worker has recorded it
    else:
        spool.discard(work)
    return outcome


def _run_in(work: Path, action, env, user, context, shared_state, stop, grace, cap,
            on_spawn, hidden: list[str]) -> Outcome:
    """Prepare the attempt's folder, run the command under its supervisor, and read what it
    left there (outcome_of)."""
    # The command's own files live in io/; the supervisor's (spec, child, result) stay in
    # the worker's folder, out of reach of a command run as another user.
    io = work / "io"
    io.mkdir(mode=0o700)
    state_file, patch_file = io / "state.json", io / "state_patch.json"
    params = context.get("params")
    # The run's shared state, its params (read-only) under "params" when it has any, and
    # the attempt's fence and the run's origin under "tollgate".
    state_file.write_text(json.dumps({**shared_state, **({"params": params} if params else {}),
                                      "tollgate": {**fence_of(context),
                                                   **origin_of(context)}}))
    argv = ["/bin/sh", "-c", action["shell"]] if "shell" in action else action["command"]
    clean = command_env(context, state_file, patch_file, env)
    if user:
        os.chmod(work, 0o711)  # the command may pass through to io/, not list or read
        for path in (io, state_file):
            os.chown(path, user.pw_uid, user.pw_gid)
        home = user.pw_dir if os.path.isdir(user.pw_dir) else str(io)
        clean.update(HOME=home, USER=user.pw_name, LOGNAME=user.pw_name)
    fence_at = stop.fence_at() if hasattr(stop, "fence_at") else None
    descriptor = os.open(work / "spec.json", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"argv": argv, "cwd": action.get("cwd") or (str(io) if user else None),
                   "env": clean, "user": user.pw_name if user else None,
                   "fence_at": fence_at, "fence_grace": getattr(stop, "fence_grace", None),
                   "timeout_seconds": action.get("timeout_seconds"),
                   # What to redact besides the worker's own secrets, for whoever reads
                   # this folder's result (the folder is the worker's alone).
                   "redact": hidden}, handle)
    lifeline, keep = os.pipe()
    line = Lifeline(keep)
    try:
        # The supervisor starts with the command's clean environment, not the worker's: a
        # command can read its parent's /proc/PID/environ.
        supervisor = subprocess.Popen(
            [sys.executable, "-I", str(SUPERVISOR), str(lifeline), str(work), str(grace)],
            pass_fds=(lifeline,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, env=clean)
    finally:
        os.close(lifeline)
    if hasattr(stop, "attach"):
        stop.attach(line)  # each renewal of the lease moves the supervisor's fence
    try:
        _wait(supervisor, work, action.get("timeout_seconds"), stop, on_spawn)
    finally:
        if hasattr(stop, "detach"):
            stop.detach(line)
        line.close()
    return outcome_of(work, secret_values(env), cap)


def outcome_of(work: Path, secrets: list[str], cap: int | None = None) -> Outcome:
    """What an attempt's folder says happened: the supervisor's result, the output, the
    state patch, and why the worker stopped it if it did. The worker reads it as soon as the
    command ends; after a consumer died, whoever finds the folder (spool.reap) reads the
    same."""
    cap = settings.TOLLGATE_OUTPUT_CAP if cap is None else cap
    spec = _read_json(work / "spec.json") or {}
    clean = redaction.Redactor({*secrets, *spec.get("redact", [])})
    argv = spec.get("argv") or ["?"]
    result = _read_json(work / "result.json") or {}
    reason = worker_reason = (_read_text(work / "reason") or "").strip()
    if not reason and result.get("stopped") == "fenced":
        reason = "fenced"  # the supervisor stopped it: the lease ran out unrenewed
    if result.get("error") and result.get("exit_code") is None and "pid" not in result:
        return Outcome(False, clean.text(f"Could not start {argv[0]!r}: {result['error']}"),
                       {"argv": [clean.text(a) for a in argv]})
    stdout, stdout_bytes = read_capped(work / "stdout", cap)
    stderr, stderr_bytes = read_capped(work / "stderr", cap)
    evidence = {
        "exit_code": result.get("exit_code"),
        "stdout": clean.text(stdout), "stderr": clean.text(stderr),
        "stdout_bytes": stdout_bytes, "stderr_bytes": stderr_bytes,
        "pid": result.get("pid"), "pgid": result.get("pgid"),
    }
    if result.get("signal"):
        evidence["signal"] = result["signal"]
    if not result and reason and not (work / "child.json").exists():
        # Stopped while its supervisor was still starting: the command never began.
        return Outcome(False, f"Stopped ({reason}) before the command began", evidence)
    if not result:
        return Outcome(False, "The command's supervisor left no result (it was killed)",
                       evidence)
    if reason and result.get("exit_code") is not None and not result.get("stopped"):
        # The command exited by itself before anything stopped it: its exit code is the
        # outcome, whatever the worker asked for meanwhile (a lost lease, a timeout at the
        # same moment). Its lease token still decides whether it is recorded.
        evidence["stop_requested"] = reason
        reason = ""
    if reason == "timed_out":
        evidence["timed_out"] = True
        return Outcome(False, f"Timed out after {spec.get('timeout_seconds')}s; process tree "
                              "terminated", evidence)
    owner_gone = result.get("stopped") == "owner_gone" and not worker_reason
    if owner_gone and result.get("exit_code") is not None:
        # Told to stop as its consumer died, the command exited by itself (its own exit
        # code, no signal): it finished, and its exit code says how; its lease still holds,
        # so the result is recorded from the spool. Only a command a signal ended runs
        # again. (A fenced one is past its lease: nothing it did can be recorded.)
        evidence["stopped_then_exited"] = result["stopped"]
    elif reason or result.get("stopped") == "owner_gone":
        reason = reason or "owner_gone"
        evidence["terminated"] = reason
        return Outcome(False, STOP_SUMMARIES.get(reason, STOP_SUMMARIES["stopped"]),
                       evidence, retryable=reason in ("fenced", "owner_gone"))
    if result.get("exit_code") != 0:
        how = (f"signal {result['signal']}" if result.get("signal")
               else f"status {result.get('exit_code')}")
        return Outcome(False, f"Exited with {how}", evidence)
    patch, problem = read_patch(work / "io" / "state_patch.json")
    if problem:
        return Outcome(False, problem, evidence)
    return Outcome(True, "Exited with status 0", evidence, clean.value(patch))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


PATCH_CAP = 1 << 20


def read_patch(path: Path) -> tuple[dict, str]:
    """(the state patch a command wrote, or a sentence saying why it cannot be used)."""
    try:
        if path.is_symlink():
            return {}, "State patch file is a symbolic link; write a plain file"
        data = path.read_bytes()[:PATCH_CAP + 1]
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:
        return {}, f"State patch file cannot be read: {exc.strerror or exc}"
    if not data.strip():
        return {}, ""
    if len(data) > PATCH_CAP:
        return {}, f"State patch file is larger than {PATCH_CAP} bytes"
    try:
        patch = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, f"State patch file is not UTF-8 (byte {exc.start})"
    except (json.JSONDecodeError, RecursionError) as exc:
        return {}, f"State patch file is not valid JSON: {exc}"
    if not isinstance(patch, dict):
        return {}, "State patch file must hold a JSON object"

    try:
        check_json(patch, "state patch")
    except BadValue as exc:
        return {}, f"State patch file: {exc}"
    return patch, ""


def command_user():
    """The account commands run as (TOLLGATE_COMMAND_USER), or None for the worker's own."""
    name = settings.TOLLGATE_COMMAND_USER
    if not name:
        return None
    import pwd

    return pwd.getpwnam(name)


STOP_SUMMARIES = {
    "stopped": "Stopped: the step was cancelled or its lease was lost",
    "fenced": "Stopped: the lease could not be renewed before it ran out (worker fenced)",
    "owner_gone": "Stopped: the worker running it died",
}


def _wait(supervisor: subprocess.Popen, work: Path, timeout, stop, on_spawn) -> str:
    """Wait for the supervisor; ask it to stop the command on timeout or `stop`, noting why
    in the folder first (file `reason`). Returns why ("" if it ended by itself)."""
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
                try:
                    (work / "reason").write_text(reason)
                except OSError:
                    pass  # a full disk: the stop matters more than its note
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
        clean = redaction.redactor()  # only when there is output to redact
        return Outcome(False, clean.text(f"{type(exc).__name__}: {exc}"),
                       {"traceback": clean.text(traceback.format_exc(limit=8))})
    if result is not None and not isinstance(result, dict):
        return Outcome(False, f"{path} returned {type(result).__name__}, not a dict or None")
    return Outcome(True, f"{path} returned", {},
                   redaction.redactor().value(result) if result else {})


def execute(action: dict, *, context: dict, shared_state: dict, stop: threading.Event,
            on_spawn=None) -> Outcome:
    """Run any action, as the spec describes it."""
    if "callable" in action:
        return run_callable(action, context=context, shared_state=shared_state)
    if "agent" in action:
        return run_agent(action, context=context, shared_state=shared_state, stop=stop,
                         on_spawn=on_spawn)
    return run_process(action, context=context, shared_state=shared_state, stop=stop,
                       on_spawn=on_spawn)


def run_agent(action: dict, *, context: dict, shared_state: dict, stop: threading.Event,
              on_spawn=None) -> Outcome:
    """Run a coding agent as a command: its provider's non-interactive command line with the
    prompt (params and state filled in), under the same supervisor, lease, timeout, output
    capture and redaction as any command. With several providers, the next is tried when
    one fails; the evidence names the provider that ran and those tried."""
    agent = action["agent"]
    prompt = fill(agent["prompt"], shared_state, context.get("params"), show=as_is)
    account = action.get("account") or agent.get("account")
    tried, outcome = [], None
    for provider in agent["providers"]:
        if outcome is not None:
            spool.discard(outcome.spooled)  # a provider that failed: the next one runs
        try:
            argv = agents.command_line(provider, prompt)
        except agents.ProviderError as exc:
            outcome = Outcome(False, str(exc), retryable=False)
        else:
            command = {key: value for key, value in action.items()
                       if key in ("timeout_seconds", "cwd", "env")}
            command.update(command=argv, account=account)
            outcome = run_process(command, context={**context, "provider": provider},
                                  shared_state=shared_state, stop=stop, on_spawn=on_spawn)
        tried.append(provider)
        outcome.evidence.update(provider=provider, providers_tried=list(tried))
        if outcome.ok or stop.is_set():
            break
    outcome.summary = f"{outcome.summary} ({'agent ' + tried[-1]})"
    return outcome

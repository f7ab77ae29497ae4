"""Real processes for tests and the bench: Huey consumers, gunicorn, free ports, waiting."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# However busy the machine, another process gets this long (seconds) to do what a test waits
# for. A wait that succeeds returns at once, so only a failure costs the whole bound; the
# bounds a test names are floors raised to this. TOLLGATE_TEST_PATIENCE scales it.
PATIENCE = 180 * float(os.environ.get("TOLLGATE_TEST_PATIENCE", "1"))


def patience(seconds: float = 0) -> float:
    """The bound for a wait a test names `seconds` long: never less than PATIENCE."""
    return max(seconds, PATIENCE)


# The log files of the processes the running test started (cleared before each test): a
# wait that fails shows their ends.
LOGS: list = []


def wait_for(predicate, timeout: float = 0, interval: float = 0.1, what: str = "condition",
             log=None):
    """Poll `predicate` until it returns something truthy, for the generous bound of
    `patience(timeout)`; on timeout fail saying what it waited for, with the end of `log`
    (the other process's log file, or several) when given."""
    bound = patience(timeout)
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {bound:.0f}s waiting for {what}"
                         f"{log_tail(LOGS if log is None else log)}")


def log_tail(log, size: int = 4000) -> str:
    """The end of each log file named (a path, an open file, or a list of them), to show
    with a failure: what the other process was doing."""
    if log is None:
        return ""
    shown = ""
    for one in log if isinstance(log, (list, tuple)) else [log]:
        path = Path(getattr(one, "name", one))
        try:
            with open(path, "rb") as handle:
                handle.seek(max(0, path.stat().st_size - size))
                text = handle.read().decode(errors="replace")
        except (OSError, TypeError):
            continue
        shown += f"\n--- the end of {path.name}:\n{text}"
    return shown


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


# A container's view of the machine: its own pid and UTS namespaces (root only).
CONTAINER = ("unshare", "--pid", "--uts", "--fork", "--mount-proc", "--kill-child")


def start_consumer(env: dict, *, workers: int = 2, log=subprocess.DEVNULL,
                   container: str = "", skew: str = "", wall_step: str = "",
                   netns: str = "") -> subprocess.Popen:
    """`manage.py run_huey` with thread workers, in a session of its own; with `container`
    (a host name), in pid and UTS namespaces of its own, as a container on this node; with
    `skew` ("-30s", "+60s"), its wall clock that far off (faketime; monotonic time kept); with
    `wall_step` (a file holding an offset in seconds), a wall clock that steps whenever the
    file is rewritten, monotonic time running on (`wallstep`); with `netns`, in that network
    namespace (a host of its own on the network, tests/support/netns.py)."""
    command = [sys.executable, "manage.py", "run_huey", "--workers", str(workers),
               "--worker-type", "thread"]
    if skew:  # libfaketime itself: the faketime wrapper's semaphore fails in a namespace.
        # Commands (and their supervisors) get the same clocks, as on one skewed machine.
        env = {**env, "LD_PRELOAD": libfaketime(), "FAKETIME": skew,
               "TOLLGATE_COMMAND_ENV": "PATH,HOME,LANG,TMPDIR,LD_PRELOAD,FAKETIME"}
    if wall_step:
        env = {**env, "LD_PRELOAD": wallstep(), "WALLSTEP_FILE": wall_step}
    if container:
        command = [*CONTAINER, "sh", "-c", 'hostname "$0" && exec "$@"', container, *command]
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log,
                            start_new_session=True)


def wallstep() -> str:
    """tests/support/wallstep.c built (once) into var/: a wall clock that steps on cue."""
    source = ROOT / "tests" / "support" / "wallstep.c"
    built = ROOT / "var" / "wallstep.so"
    if not built.exists() or built.stat().st_mtime < source.stat().st_mtime:
        built.parent.mkdir(exist_ok=True)
        partial = built.with_suffix(f".{os.getpid()}.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(source),
                        "-ldl"], check=True)
        partial.replace(built)
    return str(built)


def libfaketime() -> str:
    """Debian's libfaketime (package faketime), or "" when it is not installed."""
    import glob

    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    return found[0] if found else ""


def inner_pid(outer: int, timeout: float = 10) -> int:
    """The consumer's pid, seen from here, inside the namespaces `unshare` made: its child's."""
    def child():
        try:
            with open(f"/proc/{outer}/task/{outer}/children") as handle:
                pids = handle.read().split()
        except OSError:
            return None
        return int(pids[0]) if pids else None

    return wait_for(child, timeout, 0.02, what="the namespaced consumer")


def answers(port: int, path: str = "/healthz") -> bool:
    """Does a server on 127.0.0.1:port answer `path` with a success? (A socket that accepts
    is not yet a server that answers: gunicorn binds before its workers have loaded the app.)"""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status < 400
    except OSError:
        return False
    finally:
        conn.close()


def listener() -> socket.socket:
    """A socket listening on a port the OS chose on 127.0.0.1, to hand to a server process
    (start_gunicorn, the events server): nobody else can take its port meanwhile, as
    another test running beside could take a port that was only looked up free."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    sock.set_inheritable(True)
    return sock


def start_gunicorn(env: dict, port: int | socket.socket, *, workers: int = 2,
                   wall_step: str = "") -> subprocess.Popen:
    """gunicorn serving tollgate.wsgi on 127.0.0.1:port, or on a `listener()` handed over
    (the test keeps it, so a gunicorn started again serves the same port); returns once it
    answers (on a busy machine its workers can take many seconds to load Django). In a
    session of its own: killpg ends it and its workers. With `wall_step`, its wall clock
    steps as start_consumer's does."""
    if wall_step:
        env = {**env, "LD_PRELOAD": wallstep(), "WALLSTEP_FILE": wall_step}
    if isinstance(port, socket.socket):
        bind, fds, port = f"fd://{port.fileno()}", (port.fileno(),), port.getsockname()[1]
    else:
        bind, fds = f"127.0.0.1:{port}", ()
    web = subprocess.Popen(
        [str(Path(sys.executable).with_name("gunicorn")), "tollgate.wsgi", "--bind", bind,
         "--workers", str(workers), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=fds, start_new_session=True)
    wait_for(lambda: answers(port) or web.poll() is not None, 120, what="gunicorn")
    assert web.poll() is None, "gunicorn exited before it answered"
    return web


def stop(proc: subprocess.Popen, *, sig=signal.SIGINT, timeout: float = 10) -> None:
    """Ask a process to stop (SIGINT lets Huey finish its tasks), then SIGKILL it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

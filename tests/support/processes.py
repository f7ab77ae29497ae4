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


def wait_for(predicate, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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


def start_gunicorn(env: dict, port: int, *, workers: int = 2,
                   wall_step: str = "") -> subprocess.Popen:
    """gunicorn serving tollgate.wsgi on 127.0.0.1:port; returns once it answers (on a
    busy machine its workers can take many seconds to load Django). With `wall_step`, its
    wall clock steps as start_consumer's does."""
    if wall_step:
        env = {**env, "LD_PRELOAD": wallstep(), "WALLSTEP_FILE": wall_step}
    web = subprocess.Popen(
        [str(Path(sys.executable).with_name("gunicorn")), "tollgate.wsgi", "--bind",
         f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

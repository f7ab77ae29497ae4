"""Start real `manage.py run_huey` processes against the test database and queue."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from django.conf import settings
from django.db import connection

from ..support.processes import LOGS, ROOT, inner_pid, start_consumer, stop, wait_for

__all__ = ["ROOT", "Consumer", "consumer_env", "database_url", "freeze", "wait_for",
           "wait_stopped"]


def _sqlite_writable() -> bool:
    """Can a writer take SQLite's one write lock now (nobody holds it)?"""
    import sqlite3

    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2,
                            isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def wait_stopped(pid: int) -> None:
    """Until every thread of `pid` has stopped: SIGSTOP is delivered asynchronously, and a
    process on the other core runs on (and may take a lock) after kill() has returned."""
    def stopped() -> bool:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return True
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as handle:
                    state = handle.read().rpartition(")")[2].split()[0]
            except (FileNotFoundError, IndexError):
                continue
            if state not in ("T", "t", "Z", "X"):
                return False
        return True

    wait_for(stopped, interval=0.005, what=f"process {pid} to stop")


def freeze(pid: int, timeout: float = 60) -> None:
    """SIGSTOP a consumer. On SQLite, at a moment it holds no write lock: SQLite has one
    writer, and a consumer frozen inside a write would hold every other writer back until
    it thaws (the README says so); the test is about a frozen worker, not that."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_stopped(pid)
        if connection.vendor != "sqlite" or _sqlite_writable():
            return
        os.kill(pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"consumer {pid} held SQLite's write lock for {timeout}s")
        time.sleep(0.02)


def freeze_cgroup(cgroup, timeout: float = 60) -> None:
    """Pause every process of a cgroup (its freezer, as `docker pause` does), at a moment
    none holds SQLite's write lock (see freeze)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        (cgroup / "freezer.state").write_text("FROZEN")
        while (cgroup / "freezer.state").read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                raise AssertionError(f"{cgroup} did not pause within {timeout}s")
            time.sleep(0.01)
        if connection.vendor != "sqlite" or _sqlite_writable():
            return
        (cgroup / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise AssertionError(f"{cgroup} held SQLite's write lock for {timeout}s")
        time.sleep(0.02)


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    user = db["USER"] or ""
    auth = f"{user}:{db['PASSWORD']}@" if db["PASSWORD"] else (f"{user}@" if user else "")
    return f"postgres://{auth}{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def consumer_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tollgate.settings",
        "DEBUG": "0",
        "DATABASE_URL": database_url(),
        "TOLLGATE_HUEY_NAME": settings.HUEY["name"],
        "TOLLGATE_LEASE_SECONDS": "2",
        "TOLLGATE_SWEEP_SECONDS": "1",
        "TOLLGATE_KILL_GRACE_SECONDS": "1",
        "TOLLGATE_CALLABLES": "workflows.callables.*,tests.callables.*",
        "LOG_LEVEL": "WARNING",
        "TOLLGATE_EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
    }
    if settings.HUEY["huey_class"] == "huey.SqliteHuey":
        env["TOLLGATE_HUEY_FILE"] = settings.HUEY["filename"]
    env.update(extra)
    return env


class Consumer:
    """One consumer process; stopped (SIGINT, then SIGKILL) when the test ends."""

    def __init__(self, workers: int = 2, log: Path | None = None, container: str = "",
                 skew: str = "", wall_step: str = "", netns: str = "", **env: str):
        self.log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        if log and Path(log) not in LOGS:
            LOGS.append(Path(log))
        self.proc = start_consumer(consumer_env(**env), workers=workers, log=self.log,
                                   container=container, skew=skew, wall_step=wall_step,
                                   netns=netns)
        # The consumer process itself, as this test sees it (in a container: unshare's child).
        self.pid = inner_pid(self.proc.pid) if container else self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no signal handler runs, whatever it held is lost."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop(self.proc)
        if self.log is not subprocess.DEVNULL:
            self.log.close()

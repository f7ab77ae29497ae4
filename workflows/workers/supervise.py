"""A small supervisor around each command a worker runs: `python -I supervise.py FD DIR GRACE`.

The worker starts it with the read end of a pipe (FD) whose write end only the worker holds.
The supervisor makes itself a child subreaper, starts the command in a process group of its own
(argv, cwd and env from DIR/spec.json, output to DIR/stdout and DIR/stderr) and writes
DIR/child.json with the command's pid and process group. Then:

- the pipe reaches end-of-file (the worker process died, by any signal, SIGKILL included): the
  command's whole tree is stopped at once (SIGTERM, then SIGKILL within half a second);
- the lease runs out unrenewed: each time the worker renews the step's lease in the database
  it writes on the pipe the monotonic time by which the command must be stopped (a little
  before the lease ends); when that time passes with no newer one (the worker is frozen, cut
  off or slow), the tree is stopped ("fenced"). So after the lease nothing of the attempt
  runs, whether the worker is dead, frozen or alive on another machine;
- SIGTERM from the worker (cancelled, timed out, lease lost or fenced): the tree gets SIGTERM,
  then SIGKILL after GRACE seconds;
- the command exits (heard at once, through a pidfd) before any of the above stopped it: it
  finished, and its result says so; whatever it left behind (its process group, and
  grandchildren that left it, which reparent to the supervisor) gets SIGTERM, then SIGKILL
  after GRACE seconds.

It writes DIR/result.json (exit code, or the signal that ended the command, and why it was
stopped) and exits. It uses the standard library only, so `python -I` starts it quickly.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
OWNER_GONE_GRACE = 0.5


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(parent: int) -> list[int]:
    """Pids whose parent is `parent` (orphans of the command reparent to us)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry))
    return found


class Supervisor:
    def __init__(self, lifeline: int, workdir: str, grace: float) -> None:
        self.lifeline, self.workdir, self.grace = lifeline, workdir, grace
        self.status: int | None = None  # the command's wait status, once reaped
        self.stopped = ""
        self.term_requested = False
        self.fence_at: float | None = None  # time.monotonic() by which to stop, if leased
        self.fence_grace = grace
        self.pending = b""

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def start(self) -> None:
        with open(self.path("spec.json")) as handle:
            spec = json.load(handle)
        self.fence_at = spec.get("fence_at")
        self.fence_grace = min(self.grace, spec.get("fence_grace") or self.grace)
        with open(self.path("stdout"), "wb") as out, open(self.path("stderr"), "wb") as err:
            # As another account when the worker is set to (TOLLGATE_COMMAND_USER): its own
            # uid, its group, no supplementary groups of the worker's.
            account = {}
            if spec.get("user"):
                import pwd

                entry = pwd.getpwnam(spec["user"])
                account = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            try:
                self.proc = subprocess.Popen(
                    spec["argv"], cwd=spec.get("cwd") or None, env=spec["env"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                    **account)
            except (OSError, KeyError) as exc:
                self.write("result.json", {"exit_code": None,
                                           "error": getattr(exc, "strerror", None) or str(exc)})
                raise SystemExit(0) from None
        self.pgid = self.proc.pid
        self.write("child.json", {"pid": self.proc.pid, "pgid": self.pgid})

    def write(self, name: str, data: dict, durable: bool = False) -> None:
        partial = self.path(name + ".part")
        with open(partial, "w") as handle:
            json.dump(data, handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(partial, self.path(name))  # readers never see half a file
        if durable:  # the rename too: a result written survives a power cut of the host
            directory = os.open(self.workdir, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def sync_output(self) -> None:
        for name in ("stdout", "stderr", os.path.join("io", "state_patch.json")):
            try:
                with open(self.path(name), "rb") as handle:
                    os.fsync(handle.fileno())
            except OSError:
                pass

    def reap(self) -> None:
        """Collect every exited child; note the command's own status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.proc.pid:
                self.status = status
                self.proc.returncode = os.waitstatus_to_exitcode(status)

    def signal_tree(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self.descendants():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def descendants(self) -> list[int]:
        found, todo = [], [os.getpid()]
        while todo:
            for child in children_of(todo.pop()):
                found.append(child)
                todo.append(child)
        return found

    def stop_tree(self, grace: float) -> None:
        """SIGTERM the whole tree, then SIGKILL what is left after `grace` seconds."""
        self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if self.status is not None and not self.descendants() and not self.group_alive():
                return
            time.sleep(0.02)
        self.signal_tree(signal.SIGKILL)
        deadline = time.monotonic() + 5  # SIGKILL cannot be refused; only a stuck D state
        while (self.status is None or self.descendants()) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the worker, not us
        self.start()
        watched = [self.lifeline, *self.exit_signal()]
        while self.status is None:
            readable, _, _ = select.select(watched, [], [], 0.05)
            owner_gone = self.lifeline in readable and not self.hear()
            # A command that exited before anything stopped it finished, fence or not: its
            # result stands, and its lease token decides whether it is recorded. Reaped
            # before the fence is judged, so an exit just before the fence time is never
            # taken for a fenced attempt (and run again).
            self.reap()
            if self.status is not None:
                break
            if owner_gone:
                self.stopped = "owner_gone"
                self.stop_tree(OWNER_GONE_GRACE)
                break
            if self.fence_at is not None and time.monotonic() >= self.fence_at:
                self.stopped = "fenced"
                self.stop_tree(self.fence_grace)
                break
            if self.term_requested:
                self.stopped = "stopped"
                self.stop_tree(self.grace)
                break
        # The command is done; nothing it started may outlive it.
        if self.descendants() or self.group_alive():
            self.stop_tree(self.grace)
        code = os.waitstatus_to_exitcode(self.status)
        self.sync_output()
        self.write("result.json", durable=True, data={
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "stopped": self.stopped, "pid": self.proc.pid, "pgid": self.pgid})

    def exit_signal(self) -> list[int]:
        """A descriptor that becomes readable when the command exits (a pidfd), so its end
        is heard at once rather than at the next look; none where the kernel has no pidfds."""
        try:
            return [os.pidfd_open(self.proc.pid)]
        except (AttributeError, OSError):
            return []

    def hear(self) -> bool:
        """Read what the worker wrote: each line a new fence time. False at end-of-file."""
        data = os.read(self.lifeline, 4096)
        if not data:
            return False
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            try:
                self.fence_at = float(line)
            except ValueError:
                pass
        return True

    def on_term(self, signum, frame) -> None:
        self.term_requested = True


def main(argv: list[str]) -> None:
    lifeline, workdir, grace = int(argv[1]), argv[2], float(argv[3])
    become_subreaper()
    Supervisor(lifeline, workdir, grace).run()


if __name__ == "__main__":
    main(sys.argv)

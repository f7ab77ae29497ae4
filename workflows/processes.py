"""Who holds a step: a process's identity (host, boot, pid, start time) and whether it lives.

A pid alone is reused; a pid with its start time (field 22 of /proc/<pid>/stat, in clock
ticks since boot) and the boot id names one process for good.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


@functools.cache
def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # a zombie has finished; only its exit status is left
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Holder:
    host: str
    boot_id: str
    pid: int
    started: int | None

    def as_dict(self) -> dict:
        return {"host": self.host, "boot_id": self.boot_id, "pid": self.pid,
                "started": self.started}


@functools.cache
def _this(pid: int) -> Holder:
    return Holder(socket.gethostname(), boot_id(), pid, start_time(pid))


def this_process() -> Holder:
    """This consumer process (cached per pid: a forked worker process is a new holder)."""
    return _this(os.getpid())


ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"


def holder_state(host: str, holder_boot_id: str, pid: int | None, started: int | None) -> str:
    """ALIVE or GONE when this machine can tell (same boot); UNKNOWN for another machine."""
    if not holder_boot_id or pid is None:
        return UNKNOWN if host and host != socket.gethostname() else GONE
    if holder_boot_id != boot_id():
        # The same host name with another boot id rebooted: all of its processes are gone.
        return GONE if host == socket.gethostname() else UNKNOWN
    return ALIVE if started is not None and start_time(pid) == started else GONE

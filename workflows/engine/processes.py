"""Who holds a step: a process's identity (host, boot, pid namespace, pid, start time) and
whether it lives.

A pid alone is reused; a pid with its start time (field 22 of /proc/<pid>/stat, in clock
ticks since boot) and the boot id names one process for good, but only inside its pid
namespace: containers on one node share the kernel (one boot id) and each has its own pids.
A holder in another namespace cannot be looked up or signalled from here; it is remote.
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


@functools.cache
def pid_namespace() -> str:
    """This process's pid namespace, as the kernel names it ("pid:[4026531836]")."""
    try:
        return os.readlink("/proc/self/ns/pid")
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
    pidns: str = ""

    def as_dict(self) -> dict:
        return {"host": self.host, "boot_id": self.boot_id, "pidns": self.pidns,
                "pid": self.pid, "started": self.started}


@functools.cache
def _this(pid: int) -> Holder:
    return Holder(socket.gethostname(), boot_id(), pid, start_time(pid), pid_namespace())


def this_process() -> Holder:
    """This consumer process (cached per pid: a forked worker process is a new holder)."""
    return _this(os.getpid())


ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"


def holder_state(host: str, holder_boot_id: str, pid: int | None, started: int | None,
                 pidns: str = "") -> str:
    """ALIVE or GONE when this process can tell (same boot and pid namespace); UNKNOWN for
    a holder on another machine or in another container (namespace), which only its lease
    and the kill grace decide."""
    if not holder_boot_id or pid is None:
        return UNKNOWN if host and host != socket.gethostname() else GONE
    if holder_boot_id != boot_id():
        # The same host name with another boot id rebooted: all of its processes are gone.
        return GONE if host == socket.gethostname() and pidns_matches(pidns) else UNKNOWN
    if not pidns_matches(pidns):
        return UNKNOWN
    return ALIVE if started is not None and start_time(pid) == started else GONE


def pidns_matches(pidns: str) -> bool:
    """Is a holder's recorded pid namespace ours? Rows from before namespaces were recorded
    (empty) are judged as before, by boot id alone."""
    return not pidns or pidns == pid_namespace()


def local(holder_boot_id: str, pidns: str) -> bool:
    """May this process look up, or signal, a pid recorded by that holder?"""
    return bool(holder_boot_id) and holder_boot_id == boot_id() and pidns_matches(pidns)

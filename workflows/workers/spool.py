"""The spool: one folder per leased attempt of a command, kept until its result is recorded
(and one for a callable's outcome that the worker could not record).

The supervisor writes the command's outcome there durably (result.json, fsynced) before
anything else happens, so a finished result outlives the consumer that ran it: if the
consumer dies before recording it, or the database stays away past the report window, the
next consumer on this machine (at start, on its rounds, or the sweeper) records it from the
folder (`worker.record_orphans`) instead of running the command again.

A folder is named `<kind>-<id>-<lease token>`, under a folder of its own for each database
(two deployments on one machine never read each other's). The consumer process that ran it
holds a lock on its `holder.lock` for as long as it lives: the kernel lets the lock go when
the process ends, however it ends, so a folder whose lock can be taken has no holder left,
whatever pid namespace the holder ran in (a container restarted over the same spool volume
takes its old folders). `holder.json` says who held it, for people; folders from before the
lock are judged by it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path

from django.conf import settings
from django.db import connection

from workflows.engine import processes

log = logging.getLogger(__name__)

NAME = re.compile(r"^(step|compensation)-(\d+)-([0-9a-f]{8,64})$")


@functools.cache
def _database_id(name: str) -> str:
    """A short name for the database this process serves, as the server itself names it
    (so a worker through PgBouncer and one connected directly agree). Cached by the
    settings' database name: a process that moves to another database (tests do) asks
    again."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT system_identifier::text, current_database() "
                           "FROM pg_control_system()")
            identity = "postgresql:" + ":".join(cursor.fetchone())
    else:
        identity = f"{connection.vendor}:{os.path.realpath(name)}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def root() -> Path:
    """This deployment's spool: TOLLGATE_SPOOL_DIR/db-<the database's id>."""
    name = str(connection.settings_dict["NAME"])
    return Path(settings.TOLLGATE_SPOOL_DIR) / f"db-{_database_id(name)}"


# The folders this process holds: the descriptor of each one's locked holder.lock.
_held: dict[Path, int] = {}
_held_guard = threading.Lock()


def folder_of(lease: dict) -> Path:
    """Where a leased attempt's folder ({"kind", "id", "token"}) is, made or not."""
    return root() / f"{lease['kind']}-{lease['id']}-{lease['token']}"


def open_folder(lease: dict) -> Path:
    """A new folder for a leased attempt ({"kind", "id", "token"}), held by this process
    (its lock taken before the folder gets its name, so no one sees it unheld)."""
    folder = folder_of(lease)
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    making = folder.parent / f".{folder.name}.making"
    making.mkdir(mode=0o700)
    lock = os.open(making / "holder.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (making / "holder.json").write_text(json.dumps(processes.this_process().as_dict()))
        making.rename(folder)
    except BaseException:
        os.close(lock)
        shutil.rmtree(making, ignore_errors=True)
        raise
    with _held_guard:
        _held[folder] = lock
    return folder


def _let_go(folder: Path) -> None:
    """This process no longer holds the folder: whoever looks may take it."""
    with _held_guard:
        lock = _held.pop(folder, None)
    if lock is not None:
        os.close(lock)


def keep(lease: dict, outcome: dict) -> Path:
    """Keep the outcome of an attempt that ran in the worker's own process (a callable),
    which the worker could not record: written durably to a folder of its own and handed
    over, so that whoever looks next records it (this consumer's next round included)."""
    folder = open_folder(lease)
    partial = folder / "outcome.json.part"
    with open(partial, "w") as out:
        json.dump(outcome, out)
        out.flush()
        os.fsync(out.fileno())
    partial.rename(folder / "outcome.json")
    hand_over(folder)
    return folder


def kept_outcome(folder: Path) -> dict | None:
    """The outcome `keep` wrote there, if it did."""
    try:
        return json.loads((folder / "outcome.json").read_text())
    except FileNotFoundError:
        return None


def discard(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        _let_go(folder)


def hand_over(folder: Path) -> None:
    """The worker could not record this result (the database is away): whoever finds the
    folder records it, even while this consumer lives."""
    try:
        (folder / "handed_over").touch()
    except OSError:
        pass
    _let_go(folder)


def holder_gone(folder: Path) -> bool:
    """Has the process that held this folder let it go (ended, or handed it over)?"""
    try:
        lock = os.open(folder / "holder.lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return _judged_by_record(folder)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its process lives (here, or frozen)
    finally:
        os.close(lock)  # which lets go of the lock this took, if it took it
    return True


def _judged_by_record(folder: Path) -> bool:
    """A folder from before holder locks: judged by the holder it names. A record that
    cannot be read names no one, so it blocks nothing (its result is recorded only under
    its lease token, which a live holder would still need)."""
    try:
        holder = json.loads((folder / "holder.json").read_text())
        if not isinstance(holder, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        log.warning("Spool folder %s has an unreadable holder record (%s): taken as "
                    "having no holder", folder.name, exc)
        return True
    me = processes.this_process()
    if holder.get("pid") == me.pid and holder.get("started") == me.started:
        return False
    state = processes.holder_state(holder.get("host", ""), holder.get("boot_id", ""),
                                   holder.get("pid"), holder.get("started"),
                                   holder.get("pidns", ""))
    return state == processes.GONE


def orphans() -> list[tuple[str, int, str, Path]]:
    """(kind, id, lease token, folder) for each folder whose result its own worker will not
    record: its process is gone, or handed it over. A live process's are left alone."""
    try:
        entries = list(root().iterdir())
    except FileNotFoundError:
        return []
    found = []
    for folder in entries:
        match = NAME.match(folder.name)
        if not match:
            continue  # being made, or not a folder of ours
        if (folder / "handed_over").exists() or holder_gone(folder):
            found.append((match[1], int(match[2]), match[3], folder))
    return found


def finished(folder: Path) -> bool:
    """Has the supervisor written the command's result (or the worker kept an outcome)?"""
    return (folder / "result.json").exists() or (folder / "outcome.json").exists()

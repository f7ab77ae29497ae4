"""The spool: one folder per leased attempt of a command, kept until its result is recorded
(and one for a callable's outcome that the worker could not record).

The supervisor writes the command's outcome there durably (result.json, fsynced) before
anything else happens, so a finished result outlives the consumer that ran it: if the
consumer dies before recording it, or the database stays away past the report window, the
next consumer on this machine (at start, on its rounds, or the sweeper) records it from the
folder (`worker.record_orphans`) instead of running the command again.

A folder is named `<kind>-<id>-<lease token>` and holds `holder.json`, the consumer process
that ran it, so a live consumer's folders are left to it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from django.conf import settings

from . import processes

NAME = re.compile(r"^(step|compensation)-(\d+)-([0-9a-f]{8,64})$")


def root() -> Path:
    return Path(settings.TOLLGATE_SPOOL_DIR)


def open_folder(lease: dict) -> Path:
    """A new folder for a leased attempt ({"kind", "id", "token"}), naming its holder."""
    base = root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = base / f"{lease['kind']}-{lease['id']}-{lease['token']}"
    folder.mkdir(mode=0o700)
    (folder / "holder.json").write_text(json.dumps(processes.this_process().as_dict()))
    return folder


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


def hand_over(folder: Path) -> None:
    """The worker could not record this result (the database is away): whoever finds the
    folder records it, even while this consumer lives."""
    try:
        (folder / "handed_over").touch()
    except OSError:
        pass


def orphans() -> list[tuple[str, int, str, Path]]:
    """(kind, id, lease token, folder) for each folder whose result its own worker will not
    record: its consumer is gone, or handed it over. A live consumer's are left alone."""
    try:
        entries = list(root().iterdir())
    except FileNotFoundError:
        return []
    found = []
    me = processes.this_process()
    for folder in entries:
        match = NAME.match(folder.name)
        if not match:
            continue
        try:
            holder = json.loads((folder / "holder.json").read_text())
        except (OSError, ValueError):
            continue  # being made, or not ours to judge
        if not (folder / "handed_over").exists():
            if holder.get("pid") == me.pid and holder.get("started") == me.started:
                continue  # this process's own attempt in flight
            state = processes.holder_state(holder.get("host", ""), holder.get("boot_id", ""),
                                           holder.get("pid"), holder.get("started"),
                                           holder.get("pidns", ""))
            if state != processes.GONE:
                continue
        found.append((match[1], int(match[2]), match[3], folder))
    return found


def finished(folder: Path) -> bool:
    """Has the supervisor written the command's result (or the worker kept an outcome)?"""
    return (folder / "result.json").exists() or (folder / "outcome.json").exists()

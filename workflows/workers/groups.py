"""Finished attempts waiting to be recorded together, in one group commit.

A consumer thread that claimed a batch of steps runs them one after another and records
their outcomes at the end, in one transaction. No outcome waits longer than `hold`
seconds for a slow neighbour: a watcher thread records whatever waits once the oldest has
waited that long, in its own transaction (and database connection).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

log = logging.getLogger(__name__)


class Group:
    """Use as a context manager; `add` what finished, `take` what waits (for the caller to
    record). `record(items)` is how the watcher records what waited too long."""

    def __init__(self, hold: float, record) -> None:
        self.hold = hold
        self.record = record
        self.waiting: list = []
        self.oldest = 0.0  # time.monotonic() when the oldest waiting item finished
        self.closed = False
        self.changed = threading.Condition()
        self.watcher = threading.Thread(target=self._watch, name="group-commit", daemon=True)

    def __enter__(self) -> Group:
        self.watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify()
        self.watcher.join()

    def add(self, item) -> None:
        with self.changed:
            if not self.waiting:
                self.oldest = time.monotonic()
                self.changed.notify()
            self.waiting.append(item)

    def take(self) -> list:
        """What waits, now the caller's to record (the watcher's recording, if it is under
        way, ends first)."""
        with self.changed:
            items, self.waiting = self.waiting, []
            return items

    def _watch(self) -> None:
        try:
            with self.changed:
                while not self.closed:
                    if not self.waiting:
                        self.changed.wait()
                        continue
                    left = self.oldest + self.hold - time.monotonic()
                    if left > 0:
                        self.changed.wait(left)
                        continue
                    items, self.waiting = self.waiting, []
                    try:
                        self.record(items)  # holding the lock: `take` waits for it
                    except Exception:
                        log.exception("Could not record %s finished attempt(s)", len(items))
        finally:
            connection.close()  # the watcher's own

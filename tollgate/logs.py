"""Logs: one line per event, as text or (TOLLGATE_LOG_FORMAT=json) one JSON object per line,
with the run, step and attempt on every line written while a step is worked on."""

from __future__ import annotations

import contextvars
import json
import logging
from contextlib import contextmanager

_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tollgate_log",
                                                                       default=None)


@contextmanager
def about(**fields):
    """Every log line written inside names these (run=, step=, attempt=)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class Context(logging.Filter):
    """Puts the current run, step and attempt on the record (`record.context`, and each
    field by name for formats that want it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _context.get() or {}
        record.context = fields
        record.where = (" [" + " ".join(f"{k} {v}" for k, v in fields.items()) + "]"
                        if fields else "")
        return True


# Huey's line for every task it runs and every periodic task it queues: at INFO they bury
# what a person looks for (the console mail of `make run`, a failed step); LOG_LEVEL=DEBUG
# shows them again.
ROUTINE = ("Executing ", " executed in ", "Enqueueing periodic task ")


class Quiet(logging.Filter):
    """Keeps Huey's routine lines out below DEBUG, and the traceback of a refusal (4xx) out
    of django.request's warning: the line says what was refused, and it is no error."""

    def filter(self, record: logging.LogRecord) -> bool:
        routine = isinstance(record.msg, str) and any(part in record.msg for part in ROUTINE)
        if (routine and record.name.startswith("huey") and record.levelno == logging.INFO
                and logging.getLogger().getEffectiveLevel() > logging.DEBUG):
            return False
        if record.name == "django.request" and getattr(record, "status_code", 500) < 500:
            record.exc_info, record.exc_text = None, None
        return True


class Json(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context, any error."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), **getattr(record, "context", {})}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)

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


class Json(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context, any error."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), **getattr(record, "context", {})}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)

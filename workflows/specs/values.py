"""JSON values as both databases store them: finite numbers, no NUL, bounded nesting."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta

MAX_DEPTH = 64


class BadValue(ValueError):
    """A value the database cannot store; the message says where."""


def check_json(value, where: str) -> None:
    """Raise BadValue for NaN or Infinity, a NUL character, or nesting deeper than MAX_DEPTH."""
    stack = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadValue(f"{where}: nested deeper than {MAX_DEPTH} levels.")
        if isinstance(item, float) and not math.isfinite(item):
            raise BadValue(f"{path}: {item} is not a finite number.")
        if isinstance(item, str) and "\x00" in item:
            raise BadValue(f"{path}: NUL characters are not allowed.")
        if isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in str(key):
                    raise BadValue(f"{path}: NUL characters are not allowed in keys.")
                stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))


def readable(value, *, none: str = "") -> str:
    """A value as a person reads it: yes/no for booleans, JSON for objects and lists, text
    and numbers as they are; `none` for None."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


PLACEHOLDER = re.compile(r"{{\s*(state|params)\.([A-Za-z0-9_.-]+)\s*}}")


def placeholder_value(match: re.Match, shared_state: dict | None, params: dict | None):
    """The value a PLACEHOLDER match names (None when missing)."""
    value = shared_state if match.group(1) == "state" else params
    for part in match.group(2).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def fill(text: str, shared_state: dict | None, params: dict | None) -> str:
    """`{{ state.key }}` and `{{ params.key }}` (dotted for nested values) filled in; a
    missing value reads as empty."""
    def text_of(match) -> str:
        value = placeholder_value(match, shared_state, params)
        return "" if value is None else str(value)

    return PLACEHOLDER.sub(text_of, text or "")


def duration(value) -> str:
    """A timedelta (or seconds) for people: '12 s', '6 min', '1 h 5 min', '2 d 3 h'."""
    if value is None or value == "":
        return ""
    if isinstance(value, int | float):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta):
        return str(value)
    seconds = value.total_seconds()
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min"

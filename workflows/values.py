"""JSON values as both databases store them: finite numbers, no NUL, bounded nesting."""

from __future__ import annotations

import math
import re

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


PLACEHOLDER = re.compile(r"{{\s*(state|params)\.([A-Za-z0-9_.-]+)\s*}}")


def fill(text: str, shared_state: dict | None, params: dict | None) -> str:
    """`{{ state.key }}` and `{{ params.key }}` (dotted for nested values) filled in; a
    missing value reads as empty."""
    def lookup(match) -> str:
        value = shared_state if match.group(1) == "state" else params
        for part in match.group(2).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "" if value is None else str(value)

    return PLACEHOLDER.sub(lookup, text or "")

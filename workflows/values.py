"""JSON values as both databases store them: finite numbers, no NUL, bounded nesting."""

from __future__ import annotations

import math

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

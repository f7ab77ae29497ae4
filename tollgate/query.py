"""Numbers from a query string: a bad one is ignored, never a 500."""

from __future__ import annotations

MAX_ID = 2**53  # JavaScript's safe integers; ids and counts above it are not ours


def whole_number(raw: str, maximum: int = MAX_ID) -> int | None:
    """Text as a whole number in 0..maximum, or None (too long to be one is not one)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(maximum))):
        return None
    value = int(raw)
    return value if value <= maximum else None


def int_param(params, name: str, default: int | None = None, *, maximum: int = MAX_ID):
    """The parameter as a whole number in 0..maximum, or `default` if missing or malformed."""
    value = whole_number(params.get(name, ""), maximum)
    return default if value is None else value

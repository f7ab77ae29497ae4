"""Numbers from a query string: a bad one is ignored, never a 500."""

from __future__ import annotations

MAX_ID = 2**53  # JavaScript's safe integers; ids and counts above it are not ours


def int_param(params, name: str, default: int | None = None, *, maximum: int = MAX_ID):
    """The parameter as a whole number in 0..maximum, or `default` if missing or malformed."""
    raw = params.get(name, "")
    if not (raw.isascii() and raw.isdigit()):
        return default
    value = int(raw)
    return value if value <= maximum else default

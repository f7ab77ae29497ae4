"""JSON values as both databases store them: finite numbers, no NUL, bounded nesting."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta
from urllib.parse import quote

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
    """A value as a person reads it: yes/no for booleans, JSON for objects and lists, a
    number of five digits or more with thousands separators (24,000; a year or a port of
    four digits stays as it is), text as it is; `none` for None."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, int | float) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


PLACEHOLDER = re.compile(r"{{\s*(state|params)\.([A-Za-z0-9_.-]+)\s*}}")


def placeholder_value(match: re.Match, shared_state: dict | None, params: dict | None):
    """The value a PLACEHOLDER match names (None when missing)."""
    value = shared_state if match.group(1) == "state" else params
    for part in match.group(2).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class Filled(str):
    """Text with its placeholders filled in, that remembers which parts were filled: the
    spec author's `template` with a marker where each value goes, and the `values`. Where
    the text is rendered (Markdown on pages and in mail, mrkdwn in chat) the author's part
    is rendered and each value put in as plain text after, so what a requester or a step
    wrote can never become a link, a mention or markup."""

    template: str
    values: list[str]  # as a person reads them (24,000)
    raw: list[str]  # as they are (24000), for addresses

    def render(self, template: str, value_as, urls: re.Pattern | None = None) -> str:
        """`template` (this text's template as rendered for the medium) with each marker
        replaced by `value_as(value)`; inside the author's own links (`urls` matches them in
        the rendered text) a value is percent-encoded into the address instead, as it is."""
        def put(match):
            return value_as(self.values[int(match.group(1))])

        def address(match):
            return quote(self.raw[int(match.group(1))], safe="")

        if urls is not None:
            template = urls.sub(lambda link: MARKER.sub(address, link.group()), template)
        return MARKER.sub(put, template)


# Where each value goes: letters and digits, so a Markdown link the author wrote around it
# stays one link (and nothing else in a spec is likely to spell it).
MARKER = re.compile(r"tgvalue(\d+)eulavgt")


def as_is(value) -> str:
    """A value as a program takes it: str(), empty for None."""
    return "" if value is None else str(value)


def fill(text: str, shared_state: dict | None, params: dict | None, *,
         show=readable) -> Filled:
    """`{{ state.key }}` and `{{ params.key }}` (dotted for nested values) filled in as
    `show` gives them: as a person reads them by default (`readable`: 24,000, yes, JSON),
    `as_is` for a program; a missing value reads as empty. The result is a `Filled`."""
    found: list[str] = []
    raw: list[str] = []

    def text_of(match) -> str:
        value = placeholder_value(match, shared_state, params)
        return "" if value is None else show(value)

    def marker(match) -> str:
        found.append(text_of(match))
        raw.append(as_is(placeholder_value(match, shared_state, params)))
        return f"tgvalue{len(found) - 1}eulavgt"

    source = MARKER.sub("", text or "")
    filled = Filled(PLACEHOLDER.sub(text_of, source))
    filled.template = PLACEHOLDER.sub(marker, source)
    filled.values, filled.raw = found, raw
    return filled


def unlinkable(text: str) -> str:
    """Plain text that a mail reader or a chat client will not turn into a link or a
    mention: a zero-width space after each "://", "." , "@" and ":" breaks what they
    detect, and is invisible to the reader."""
    return re.sub(r"(://|[.@:])", "\\1\u200b", text)


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


def pretty_json(value) -> str:
    """Indented JSON, as pages show evidence and patches."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


# Words people read for the statuses and kinds whose names are not words already.
WORDS = {
    "waiting_approval": "waiting for approval",
    "step_started": "step started",
    "stale_result": "stale result ignored",
    "transition": "reported by an agent",
    "approval_recorded": "approval recorded",
    "lease_overdue": "lease overdue, holder alive",
    "lease_recovered": "worker gone, recovered",
    "sweep_failed": "sweeper could not handle this",
}


def label(value) -> str:
    """A status or kind as words: waiting_approval -> waiting for approval."""
    value = str(value or "")
    return WORDS.get(value, value.replace("_", " "))

r"""Keeping secrets out of what is stored: every secret value this worker knows, whatever its
variable is called, in the forms a command could print it (plain, reversed, rot13, base64
and base64url, base32, URL, hex plain or spaced, JSON-escaped, every character \u-escaped) and
any long enough piece of it, also when it is cut across lines or spaced out; and any base64
blob that decodes (or gunzips, or inflates) to text holding one.

What is known: the secret settings (signing key, database, mail and Redis passwords), every
named secret the worker can resolve (TOLLGATE_SECRET_* variables and the files of
TOLLGATE_SECRETS_DIR), the worker's secret-looking variables and those TOLLGATE_REDACT_ENV
names, and whatever the caller adds (an account's values, a step's env).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import gzip
import io
import json
import os
import re
import zlib
from pathlib import Path
from urllib.parse import quote, quote_plus, urlsplit

from django.conf import settings

REDACTED = "[redacted]"
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
SECRET_PREFIX = "TOLLGATE_SECRET_"
SHORTEST = 4  # shorter values are redacted nowhere: they would blank ordinary words
PIECE = 8  # any run of this many characters of a secret counts as the secret
SECRET_FILE_CAP = 64 * 1024


def _settings_secrets() -> set[str]:
    values = {settings.SECRET_KEY}
    values.update(db.get("PASSWORD") or "" for db in settings.DATABASES.values())
    for mailer in getattr(settings, "MAILERS", {}).values():
        values.add(mailer.get("OPTIONS", {}).get("password") or "")
    if getattr(settings, "REDIS_URL", ""):
        values.add(urlsplit(settings.REDIS_URL).password or "")
    return values


def read_secret(path: Path) -> str | None:
    """A secret file's value as a step gets it (its last newline dropped), or None when it
    cannot be read."""
    try:
        return path.read_text().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return None


def _folder_secrets() -> set[str]:
    """Every secret file this worker could hand a step, read as steps get them."""
    folder = settings.TOLLGATE_SECRETS_DIR
    if not folder:
        return set()
    values = set()
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return set()
    for path in entries:
        try:
            small = path.is_file() and path.stat().st_size <= SECRET_FILE_CAP
        except OSError:
            continue
        if small and (value := read_secret(path)) is not None:
            values.add(value)
    return values


# Names that say where a secret is kept, not what it is (TOLLGATE_AUDIT_KEY_FILE): their
# values are paths, and a path's pieces ("tollgate") are ordinary words of any output.
WHERE_SUFFIXES = ("_FILE", "_DIR", "_PATH")


def looks_secret(name: str) -> bool:
    """A variable whose value is a secret by its name: TOKEN, SECRET, PASSWORD or KEY in it
    (not a path to one: *_FILE, *_DIR, *_PATH), or named in TOLLGATE_REDACT_ENV."""
    name = name.upper()
    if name in {n.upper() for n in settings.TOLLGATE_REDACT_ENV}:
        return True
    return (any(marker in name for marker in SECRET_MARKERS)
            and not name.endswith(WHERE_SUFFIXES))


def known_secrets(extra=()) -> list[str]:
    """Every secret value to keep out of what is stored, longest first."""
    values = _settings_secrets() | _folder_secrets() | set(extra)
    values.update(value for name, value in os.environ.items()
                  if name.startswith(SECRET_PREFIX) or looks_secret(name))
    return sorted({v for v in values if v and len(v) >= SHORTEST}, key=len, reverse=True)


def _base64_cores(raw: bytes) -> set[str]:
    """The base64 text of `raw` wherever it sits in a longer encoded stream: for each of the
    three alignments, the characters that encode only bytes of `raw`."""
    cores = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw + b"\0\0").decode()
        first = -(-shift // 3)  # the first group of 3 bytes wholly inside raw
        last = (shift + len(raw)) // 3  # one past the last such group
        core = encoded[4 * first:4 * last]
        if len(core) >= PIECE:
            cores.update((core, core.replace("+", "-").replace("/", "_")))
    return cores


def _base32_cores(raw: bytes) -> set[str]:
    """As _base64_cores, for base32 (groups of 5 bytes, 8 characters)."""
    cores = set()
    for shift in range(5):
        encoded = base64.b32encode(b"\0" * shift + raw + b"\0" * 4).decode()
        first = -(-shift // 5)
        last = (shift + len(raw)) // 5
        core = encoded[8 * first:8 * last]
        if len(core) >= PIECE:
            cores.add(core)
    return cores


def forms(secret: str) -> set[str]:
    """The ways a command could print `secret` whole (white space aside: spans() also
    looks in the text with its white space taken out)."""
    raw = secret.encode()
    rot13 = codecs.encode(secret, "rot13")
    found = {secret, secret[::-1], rot13, rot13[::-1], raw.hex(), raw.hex().upper(),
             quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1],
             "".join(f"\\u{ord(c):04x}" for c in secret),
             "".join(f"\\u{ord(c):04X}" for c in secret)}
    for separator in (":", "-", "\\x", "0x"):
        found.update((separator.join(f"{b:02x}" for b in raw),
                      separator.join(f"{b:02X}" for b in raw)))
    plain = base64.b64encode(raw).decode()
    found.update((plain, plain.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")))
    found.update(_base64_cores(raw))
    thirty_two = base64.b32encode(raw).decode()
    found.update((thirty_two, thirty_two.rstrip("="), thirty_two.lower().rstrip("=")))
    found.update(_base32_cores(raw))
    return {form for form in found if len(form) >= SHORTEST}


BLOB = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
BLOB_CAP = 1 << 20  # what a blob may decode to before it is looked into no further


# Whole lines of base64 as `base64` wraps them (and a last line that may be short).
WRAPPED = re.compile(r"(?:^[A-Za-z0-9+/_-]{16,}={0,2}[ \t]*\r?\n)+"
                     r"(?:[A-Za-z0-9+/_-]*={0,2}[ \t]*(?:\r?\n|$))?", re.MULTILINE)


def _blobs(text: str):
    """(start, end, blob) for each base64-looking run on a line, and for each run of whole
    lines of base64, joined (with and without its last line, which may be other output)."""
    for match in BLOB.finditer(text):
        yield match.start(), match.end(), match.group()
    for match in WRAPPED.finditer(text):
        lines = match.group().split()
        yield match.start(), match.end(), "".join(lines)
        yield match.start(), match.end(), "".join(lines[:-1])


def _decoded(blob: str) -> str | None:
    """A base64 blob's text, gunzipped or inflated when it is compressed; None when it is
    not base64 at all."""
    try:
        raw = base64.b64decode(blob + "=" * (-len(blob) % 4), altchars=b"-_"
                               if ("-" in blob or "_" in blob) else None, validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.GzipFile(fileobj=io.BytesIO(raw)).read(BLOB_CAP)
        elif raw[:1] == b"\x78":
            raw = zlib.decompressobj().decompress(raw, BLOB_CAP)
    except (OSError, EOFError, zlib.error):
        pass
    return raw.decode("utf-8", "replace")


def pieces(text: str) -> set[str]:
    """Every run of PIECE characters of a long enough text."""
    if len(text) <= PIECE:
        return set()
    return {text[i:i + PIECE] for i in range(len(text) - PIECE + 1)}


class Redactor:
    """Replaces every form and every long enough piece of the given secrets with
    [redacted]: overlapping matches are merged, so a cut secret leaves nothing behind.
    The cost is one pass over the text for the pieces, whatever the number of secrets."""

    def __init__(self, secrets):
        self.forms: set[str] = set()
        self.pieces: set[str] = set()
        for secret in secrets:
            self.forms |= forms(secret)
            self.pieces |= pieces(secret) | pieces(secret[::-1])

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the secrets are in `text`, merged, in order: as printed, with white space
        taken out (a secret cut across short lines, or hex spaced out), and inside base64
        blobs (compressed or not) that decode to text holding one."""
        found = self._plain_spans(text)
        kept = [i for i, c in enumerate(text) if not c.isspace()]
        if len(kept) < len(text):
            squeezed = "".join(text[i] for i in kept)
            # Whole forms only: a piece matched across the white space between two words
            # would be a coincidence of the squeezing, not a secret.
            found += [(kept[start], kept[end - 1] + 1)
                      for start, end in self._plain_spans(squeezed, pieces=False)]
        found += [(start, end) for start, end, blob in _blobs(text)
                  if (decoded := _decoded(blob)) and self._plain_spans(decoded)]
        return _merged(found)

    def _plain_spans(self, text: str, pieces: bool = True) -> list[tuple[int, int]]:
        found = []
        for form in self.forms:
            at = text.find(form)
            while at != -1:
                found.append((at, at + len(form)))
                at = text.find(form, at + 1)
        if pieces and self.pieces:
            known = self.pieces
            found += [(i, i + PIECE) for i in range(len(text) - PIECE + 1)
                      if text[i:i + PIECE] in known]
        return found

    def text(self, text: str) -> str:
        if not text or not (self.forms or self.pieces):
            return text
        out, at = [], 0
        for start, end in self.spans(text):
            out += (text[at:start], REDACTED)
            at = end
        out.append(text[at:])
        return "".join(out)

    def value(self, value):
        """A JSON value with the secrets redacted from every string, keys included."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def _merged(found: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def redactor(extra=()) -> Redactor:
    """A redactor for every secret this worker knows, and `extra`."""
    return Redactor(known_secrets(extra))


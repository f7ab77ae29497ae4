"""Typed fields: a spec's run parameters (`params`), written once for every entry point.

A field has `name`, `type` (string, text, number, boolean, choice with `options`),
`required`, `default` and `description` (and `label`, for forms). `check_fields` validates
the declaration when a spec is loaded; `coerce` turns what a caller gave (JSON values, or
the strings of a form or the command line) into typed values, or raises FieldErrors naming
each field.
"""

from __future__ import annotations

import math
import re

TYPES = ("string", "text", "number", "boolean", "choice")
FIELD_KEYS = {"name", "label", "type", "required", "default", "description", "options"}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_TEXT = 10000


class FieldErrors(ValueError):
    """{field name: problem} for every value that was refused."""

    def __init__(self, errors: dict[str, str], what: str = "param",
                 labels: dict[str, str] | None = None):
        self.errors, self.what = errors, what
        labels = labels or {}
        word = "parameter" if what == "param" else what

        def sentence(name, problem):  # "Version is required (parameter 'version')"
            if name == "*":
                return f"The {word}s {problem}"
            return f"{labels.get(name) or name} {problem} ({word} {name!r})"

        super().__init__("; ".join(sentence(n, p) for n, p in errors.items()) + ".")


def check_fields(fields, where: str) -> list[dict]:
    """The normalised declaration, or ValueError naming `where` and the field."""
    if not isinstance(fields, list):
        raise ValueError(f"{where}: must be a list of fields")
    seen, normal = set(), []
    for index, field in enumerate(fields):
        if not isinstance(field, dict):
            raise ValueError(f"{where}[{index}]: must be an object")
        name = field.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(f"{where}[{index}]: name must be letters, digits and _, not "
                             "starting with a digit (at most 64)")
        at = f"{where} {name!r}"
        unknown = sorted(set(field) - FIELD_KEYS)
        if unknown:
            raise ValueError(f"{at}: unknown field {unknown[0]!r}")
        if name in seen:
            raise ValueError(f"{at}: declared twice")
        seen.add(name)
        kind = field.get("type", "string")
        if kind not in TYPES:
            raise ValueError(f"{at}: type must be one of {', '.join(TYPES)}")
        options = field.get("options")
        if kind == "choice":
            if (not isinstance(options, list) or not options
                    or not all(isinstance(o, str) and o for o in options)):
                raise ValueError(f"{at}: a choice needs options, a list of strings")
        elif options is not None:
            raise ValueError(f"{at}: only a choice has options")
        for text in ("label", "description"):
            if not isinstance(field.get(text, ""), str) or len(field.get(text, "")) > 500:
                raise ValueError(f"{at}: {text} must be a string of at most 500 characters")
        if not isinstance(field.get("required", False), bool):
            raise ValueError(f"{at}: required must be true or false")
        item = {"name": name, "type": kind, "required": field.get("required", False),
                "label": field.get("label") or name.replace("_", " ").capitalize(),
                "description": field.get("description", "")}
        if options:
            item["options"] = options
        if "default" in field:
            try:
                item["default"] = _value(item, field["default"])
            except ValueError as exc:
                raise ValueError(f"{at}: default {exc}") from None
        normal.append(item)
    return normal


def coerce(fields: list[dict], given, *, what: str = "param") -> dict:
    """Typed values for the declared fields from `given`; FieldErrors names each bad one.
    Unknown names are refused; a missing field takes its default, or is an error when
    required."""
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise FieldErrors({"*": "must be an object of name: value"}, what)
    errors, values = {}, {}
    declared = {field["name"]: field for field in fields}
    for name in given:
        if name not in declared:
            errors[name] = ("is not declared by the spec" if declared else
                            "is not taken: this spec declares none")
    for name, field in declared.items():
        raw = given.get(name)
        if raw is None or raw == "" and field["type"] != "text":
            if "default" in field:
                values[name] = field["default"]
            elif field["required"]:
                errors[name] = "is required"
            continue
        try:
            values[name] = _value(field, raw)
        except ValueError as exc:
            errors[name] = str(exc)
    if errors:
        raise FieldErrors(errors, what, {name: field.get("label", "") for name, field
                                         in declared.items()})
    return values


TRUE, FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0", ""}


def _value(field: dict, raw):
    kind = field["type"]
    if kind == "boolean":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in TRUE | FALSE:
            return raw.strip().lower() in TRUE
        raise ValueError(f"must be true or false, got {raw!r}")
    if kind == "number":
        if isinstance(raw, bool):
            raise ValueError(f"must be a number, got {raw!r}")
        if isinstance(raw, str):
            try:
                raw = float(raw) if any(c in raw for c in ".eE") else int(raw)
            except ValueError:
                raise ValueError(f"must be a number, got {raw!r}") from None
        if not isinstance(raw, int | float) or not math.isfinite(raw):
            raise ValueError(f"must be a finite number, got {raw!r}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"must be text, got {raw!r}")
    if kind == "choice" and raw not in field["options"]:
        raise ValueError(f"must be one of {', '.join(field['options'])}, got {raw!r}")
    if kind == "string" and ("\n" in raw or len(raw) > 500):
        raise ValueError("must be one line of at most 500 characters")
    if len(raw) > MAX_TEXT:
        raise ValueError(f"is longer than {MAX_TEXT} characters")
    return raw


def env_name(name: str) -> str:
    """TOLLGATE_PARAM_<NAME> for a command's environment."""
    return "TOLLGATE_PARAM_" + re.sub(r"[^A-Z0-9]", "_", name.upper())

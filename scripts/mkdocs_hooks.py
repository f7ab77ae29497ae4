"""MkDocs hooks for the documentation site: the API reference written from the OpenAPI
description the app itself serves, so that it cannot drift from the code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- openapi -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())


def reference() -> str:
    """The API's endpoints as Markdown: each operation's method, path, summary, what it
    takes and what it answers."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tollgate.settings")
    import django

    django.setup()
    from tollgate.api import api

    schema = api.get_openapi_schema()
    out = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            out.append(f"## {method.upper()} `{path}`\n")
            out.append(f"{_text(operation.get('summary', ''))}\n")
            if description := operation.get("description"):
                out.append(f"{_text(description)}\n")
            params = operation.get("parameters") or []
            if params:
                out.append("| parameter | in | required | type |\n|---|---|---|---|")
                for param in params:
                    kind = param.get("schema", {}).get("type", "")
                    out.append(f"| `{param['name']}` | {param['in']} | "
                               f"{'yes' if param.get('required') else 'no'} | {kind} |")
                out.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out.append(f"Body ({media}): {_ref(content.get('schema', {}))}\n")
            answers = operation.get("responses", {})
            if answers:
                out.append("| answer | meaning |\n|---|---|")
                for code, answer in answers.items():
                    shape = next(iter(answer.get("content", {}).values()), {}).get("schema", {})
                    what = _text(answer.get("description", ""))
                    out.append(f"| {code} | {what}{': ' + _ref(shape) if shape else ''} |")
                out.append("")
    return "\n".join(out)


def _ref(schema: dict) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"list of {_ref(schema.get('items', {}))}"
    return f"`{schema.get('type', 'object')}`"


def _text(value: str) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")

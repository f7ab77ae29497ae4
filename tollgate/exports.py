"""CSV that is safe to open in a spreadsheet."""

from __future__ import annotations

import csv
import json

# A text cell starting with one of these is read as a formula by spreadsheet programs.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value):
    """Text that a spreadsheet would evaluate gets a leading quote; numbers stay numbers;
    objects and lists (a gate form's values, evidence) are JSON, not Python's repr."""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class Echo:
    """A file-like object whose write returns what it was given, for streaming responses."""

    def write(self, value: str) -> str:
        return value


def csv_rows(rows, header=None):
    """Yield CSV lines of formula-safe cells, one at a time (for StreamingHttpResponse)."""
    writer = csv.writer(Echo())
    if header:
        yield writer.writerow(header)
    for row in rows:
        yield writer.writerow([safe_cell(cell) for cell in row])


def csv_download(rows, header, filename: str):
    """A streamed CSV attachment of formula-safe cells: rows are written as they come."""
    from django.http import StreamingHttpResponse

    response = StreamingHttpResponse(csv_rows(rows, header), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

"""What every API router shares: the error body, path parameters and the input base.

Its own module so that the routers and `tollgate/api.py` (which mounts them) import it,
not each other.
"""

from __future__ import annotations

from typing import Annotated

from ninja import Path, Query, Schema
from pydantic import ConfigDict

from tollgate.query import MAX_ID

Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Key = Annotated[str, Path(min_length=1, max_length=100)]
DAY_PATTERN = r"^\d{4}-\d{2}-\d{2}$"


def Day(description: str = "YYYY-MM-DD"):  # noqa: N802 - reads as a type in a signature
    """A date in a query string, YYYY-MM-DD exactly (`0` is not a date)."""
    return Query(None, pattern=DAY_PATTERN, description=description)


class Error(Schema):
    error: str


class Input(Schema):
    """A request body: known fields only, and JSON types as sent (true is not 1, "1" is not
    a number); the OpenAPI document says so with additionalProperties false."""

    model_config = ConfigDict(extra="forbid", strict=True)

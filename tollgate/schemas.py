"""What every API router shares: the error body, path parameters and the input base.

Its own module so that the routers and `tollgate/api.py` (which mounts them) import it,
not each other.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated

from ninja import Path, Schema
from pydantic import BeforeValidator, ConfigDict, Field

from tollgate.query import MAX_ID

Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Key = Annotated[str, Path(min_length=1, max_length=100)]
DAY = "YYYY-MM-DD, a real day"
# A required reason or comment says something: not only spaces (the document's pattern; the
# engine says which one is missing).
SAYS_SOMETHING = {"pattern": r"\S"}


class Error(Schema):
    error: str


def _whole(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An id in a body, an integer as JSON Schema says one is: 362.0 is 362 (true is no number).
WholeId = Annotated[int, Field(ge=1, le=MAX_ID), BeforeValidator(_whole)]


def _day(value):
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return date.fromisoformat(value)  # a ValueError says the day does not exist
    if isinstance(value, date):
        return value
    raise ValueError("not a date: YYYY-MM-DD")


# A day in a query string: YYYY-MM-DD exactly, a day that exists ("0" is no date).
Day = Annotated[date, BeforeValidator(_day)]


class Input(Schema):
    """A request body: known fields only, and JSON types as sent (true is not 1, "1" is not
    a number); the OpenAPI document says so with additionalProperties false."""

    model_config = ConfigDict(extra="forbid", strict=True)

"""Read-side queries shared by pages, the API and commands."""

from __future__ import annotations

from .permissions import decidable_by


def inbox_count(user) -> int:
    return decidable_by(user).count()

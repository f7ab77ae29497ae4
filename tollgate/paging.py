"""Paging a search whose matches may run to the whole table."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.utils.functional import cached_property


class CountedUpTo(Paginator):
    """Counts the matches only up to `limit` (and says "more than" past it), so a search that
    matches every run costs what a page shows rather than what the table holds; the pages
    past the limit are not offered."""

    limit = 1000

    @cached_property
    def count(self) -> int:
        return min(self.object_list.values("pk")[:self.limit + 1].count(), self.limit + 1)

    @property
    def more(self) -> bool:
        """Are there more matches than the count says?"""
        return self.count > self.limit

    @property
    def shown_count(self) -> int:
        return min(self.count, self.limit)

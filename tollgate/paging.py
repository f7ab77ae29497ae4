"""Paging a search whose matches may run to the whole table."""

from __future__ import annotations

from dataclasses import dataclass

from tollgate.query import whole_number


@dataclass
class Page:
    """One page of a query, read with one row more than it shows to know whether another
    follows: nothing is counted, so a search costs what its page costs, however many rows
    match (a word every run has, or one that a scan must look for in every row)."""

    rows: list
    number: int
    has_next: bool
    per_page: int = 25

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1

    @property
    def first_index(self) -> int:
        """The place of the page's first row among all the matches, from 1."""
        return 0 if not self.rows else (self.number - 1) * self.per_page + 1

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.rows) - 1 if self.rows else 0


MAX_PAGE = 10_000  # past this, an offset costs more than anyone pages for


def page_of(queryset, raw_number: str | None, per_page: int = 25) -> Page:
    """The page `raw_number` asks for (1 when it is not a page number), never past the
    last page that has rows: an empty page past the end gives the last one."""
    number = min(max(whole_number(raw_number or "") or 1, 1), MAX_PAGE)
    while True:
        start = (number - 1) * per_page
        rows = list(queryset[start:start + per_page + 1])
        if rows or number == 1:
            return Page(rows[:per_page], number, len(rows) > per_page, per_page)
        # Past the end: the last page is found by its first row's place, counted up to it.
        number = max(1, -(-queryset[:start].count() // per_page))

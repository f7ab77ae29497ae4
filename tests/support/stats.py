"""Figures for tests and the bench."""

from __future__ import annotations

import statistics


def percentile(values, q: float) -> float:
    """The product's own percentile (goals.progress), imported when Django is set up."""
    from goals.progress import percentile as product_percentile

    return product_percentile(list(values), q)


def summary(values) -> dict:
    """Median, p95 and count of a list of timings."""
    return {"median": statistics.median(values), "p95": percentile(values, 95), "n": len(values)}

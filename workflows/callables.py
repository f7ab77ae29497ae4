"""Python functions specs may call (`run: {"callable": "workflows.callables.noop"}`).

A callable takes the step's context (run_id, step_key, attempt, shared_state, config) and
returns None or a dict merged into the run's shared state.
"""

from __future__ import annotations

import time


def noop(context: dict) -> None:
    """Do nothing: a placeholder step, and the per-step overhead benchmark."""
    return None


def sleep(context: dict) -> dict:
    """Sleep for `shared_state["sleep_seconds"]` (default 1) and record that it did."""
    seconds = float(context["shared_state"].get("sleep_seconds", 1))
    time.sleep(seconds)
    return {f"slept_{context['step_key']}": seconds}


def count(context: dict) -> dict:
    """Increment `shared_state["count"]`: a visible trace of how many steps ran."""
    return {"count": int(context["shared_state"].get("count", 0)) + 1}


def fail(context: dict) -> None:
    """Always fail: for exercising retries and compensation."""
    raise RuntimeError(f"step {context['step_key']} failed on purpose")

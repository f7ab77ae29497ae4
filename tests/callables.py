"""Callables for tests; consumers started by tests allow `tests.callables.*`."""

import os
import time


def record(context: dict) -> None:
    """Append one line per execution to $TOLLGATE_TRACE_FILE: proof of how often a step ran.
    With `record_seconds` in the shared state it takes that long, like real work."""
    time.sleep(float(context["shared_state"].get("record_seconds", 0)))
    line = f"{context['run_id']}:{context['step_key']}:{context['attempt']}:{os.getpid()}\n"
    with open(os.environ["TOLLGATE_TRACE_FILE"], "a") as trace:
        trace.write(line)


def nap(context: dict) -> None:
    time.sleep(float(context["shared_state"].get("nap", 0.2)))


def echo_state(context: dict) -> dict:
    """Return the shared state as its patch (what a careless callable might leak)."""
    return dict(context["shared_state"])


def not_a_number(context: dict) -> dict:
    """A patch the engine refuses to store."""
    return {"ratio": float("nan")}


def wait_for_neighbour(context: dict) -> dict:
    """Wait (up to 30 s) until a step of a run of the spec "quick" is recorded completed,
    as a slow step would while its batch's earlier outcome waits; say whether it was."""
    from workflows.models import Step

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if Step.objects.filter(run__spec_name="quick", status="completed").exists():
            return {"neighbour_recorded_first": True}
        time.sleep(0.01)
    return {"neighbour_recorded_first": False}

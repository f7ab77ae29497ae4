"""The rules of a run, in Python and in SQL: settled, ready, run status, the next move.

The commit, the sweeper, the selectors and the worker's fast path all read these, so they
cannot disagree about when a step may start or what a run's status is.
"""

from __future__ import annotations

import random

from django.db.models import Exists, OuterRef, Q

from workflows.models import UNDER_WAY_STEP_STATUSES, Run, RunStatus, Step, StepKind, StepStatus
from workflows.timing import clock

SETTLED_STATUSES = (StepStatus.COMPLETED, StepStatus.SKIPPED)
UNDER_WAY = frozenset(UNDER_WAY_STEP_STATUSES)
SETTLED = Q(status__in=SETTLED_STATUSES) | Q(status=StepStatus.FAILED, continue_on_failure=True)

# For a step row: does its run have a failed step that holds the run back?
RUN_HAS_HARD_FAILURE = Exists(Step.objects.filter(
    run=OuterRef("run"), status=StepStatus.FAILED, continue_on_failure=False))


def settled(step) -> bool:
    """Done as far as its dependants care: completed, skipped, or failed but allowed to."""
    return step.status in SETTLED_STATUSES or (
        step.status == StepStatus.FAILED and step.continue_on_failure)


def hard_failure(steps):
    """The first failed step that holds the run back, if any."""
    for step in steps:
        if step.status == StepStatus.FAILED and not step.continue_on_failure:
            return step
    return None


def in_frontier(step) -> bool:
    """Does the step decide its run's status and next move? `models.STEP_FRONTIER` in Python:
    a step under way, a failure that holds the run back, a gate or wait step whose
    dependencies have settled, or a worker step that is newly ready (not announced yet)."""
    if step.status in UNDER_WAY:
        return True
    if step.status == StepStatus.FAILED:
        return not step.continue_on_failure
    return step.status == StepStatus.PENDING and step.waiting_on == 0 and (
        step.kind == StepKind.APPROVAL or step.rung_at is None)


# Worker steps whose dependencies have settled (retrying ones are in the frontier).
PENDING_READY = Q(kind=StepKind.RUN, status=StepStatus.PENDING, waiting_on=0)


def is_ready(step, now) -> bool:
    if step.kind != StepKind.RUN:
        return False
    if step.status == StepStatus.PENDING:
        return step.waiting_on == 0
    return step.status == StepStatus.RETRYING and (
        step.retry_after is None or step.retry_after <= now)


def ready_filters(now) -> tuple[Q, Q]:
    """Worker steps that may start at `now`, short of the run's state (is_ready in SQL), as
    its two ways: pending with nothing to wait for, and retrying and due. Queries test them
    apart so that each is answered from its own partial index."""
    due = Q(retry_after__isnull=True) | Q(retry_after__lte=now)
    return PENDING_READY, Q(kind=StepKind.RUN, status=StepStatus.RETRYING) & due


def ready_steps(run: Run, steps, now=None) -> list:
    """Worker steps that may start now, among all of a run's steps (or its frontier)."""
    steps = list(steps)
    if run.is_terminal or hard_failure(steps):
        return []
    now = now or clock.now()
    return [step for step in steps if is_ready(step, now)]


def at_capacity(run: Run, running: int) -> bool:
    """Does the run already run as many steps at once as its spec's `max_parallel` allows?"""
    return bool(run.max_parallel) and running >= run.max_parallel


def may_start(run: Run, step, now, *, held_back: bool, running: int = 0) -> bool:
    """May a worker start this step now? `held_back`: a failure holds the run back;
    `running`: how many of the run's worker steps run now."""
    return (not (run.is_terminal or held_back) and is_ready(step, now)
            and not at_capacity(run, running))


def may_report(run: Run, step, now, *, held_back: bool) -> bool:
    """An agent may start reporting on a step that is ready, or on a wait step whose
    dependencies have settled."""
    waiting = (step.kind == StepKind.WAIT and step.status == StepStatus.PENDING
               and step.waiting_on == 0)
    return not (run.is_terminal or held_back) and (waiting or is_ready(step, now))


def claimable_at(run: Run, frontier, first_ready, *, held_back: bool, running: int, now):
    """When a worker may next claim a step of the run: now if one is ready and the run is
    under its `max_parallel`, else when its next retry is due; None if nothing waits for a
    worker. Workers claim runs in order of priority, then of how long they have waited."""
    if run.is_terminal or held_back or at_capacity(run, running):
        return None
    if first_ready is not None:
        return now
    due = [s.retry_after for s in frontier if s.status == StepStatus.RETRYING and s.retry_after]
    return min(due) if due else None


def run_status(run: Run, frontier, *, unsettled: bool, moved: bool) -> str:
    """The run's status from its frontier: the one place this rule is written."""
    if run.status == RunStatus.CANCELLED:
        return RunStatus.CANCELLED
    if not unsettled:
        return RunStatus.COMPLETED
    statuses = {step.status for step in frontier}
    if statuses & {StepStatus.RUNNING, StepStatus.RETRYING}:
        return RunStatus.RUNNING
    if hard_failure(frontier):
        return RunStatus.FAILED
    if StepStatus.WAITING_APPROVAL in statuses:
        return RunStatus.WAITING_APPROVAL
    if StepStatus.BLOCKED in statuses:
        return RunStatus.BLOCKED
    return RunStatus.RUNNING if moved else RunStatus.OPEN


# What moves a run on next, in the order its status is decided (see run_status).
MOVES = (
    (StepStatus.RUNNING, "running"),
    (StepStatus.RETRYING, "retrying"),
    (StepStatus.FAILED, "retry_available"),
    (StepStatus.WAITING_APPROVAL, "waiting_approval"),
    (StepStatus.BLOCKED, "blocked"),
)


def next_move(steps, ready=None) -> tuple[str, object | None]:
    """(what kind of move, the step it is on): running, retrying, retry_available,
    waiting_approval, blocked, awaiting_report, ready, or ("", None) when nothing can move
    the run."""
    steps = list(steps)
    for status, move in MOVES:
        for step in steps:
            if step.status == status and (status != StepStatus.FAILED
                                          or not step.continue_on_failure):
                return move, step
    for step in steps:
        if step.kind == StepKind.WAIT and step.status == StepStatus.PENDING and (
                step.waiting_on == 0):
            return "awaiting_report", step
    if ready is not None:
        return "ready", ready
    return "", None


def next_action(steps, ready=None) -> tuple[str, str]:
    """(current step key, what happens next) for the run page and the API."""
    move, step = next_move(steps, ready)
    if step is None:
        return "", ""
    return step.key, {
        "running": f"{step.title} is running",
        "retrying": f"{step.title} will retry",
        "retry_available": f"{step.title} failed; retry or cancel",
        "waiting_approval": f"{step.title}: waiting on {step.approval_group}"
        if step.approval_group else f"{step.title}: waiting for approval",
        "blocked": f"{step.title} is blocked: {step.last_summary}".strip(),
        "awaiting_report": f"{step.title} waits for a report",
        "ready": f"{step.title} is ready to start",
    }[move]


MISSING = object()


def _read(when: dict, shared_state: dict, params: dict) -> tuple[str, object]:
    """(where a condition looks, in words; the value there, or MISSING)."""
    source = "state" if "state" in when else "params"
    value = shared_state if source == "state" else params
    for part in when[source].split("."):
        value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
    return f"{source} {when[source]}", value


def condition_holds(when: dict, shared_state: dict, params: dict) -> tuple[bool, str]:
    """(does a step's `when` hold, a sentence saying why for the timeline)."""
    where, value = _read(when, shared_state, params)
    shown = "missing" if value is MISSING else repr(value)
    if "exists" in when:
        holds = (value is not MISSING) == when["exists"]
        return holds, f"{where} is {'set' if value is not MISSING else 'missing'}"
    if "equals" in when:
        return value == when["equals"], f"{where} is {shown}, the condition wants " \
                                        f"{when['equals']!r}"
    if "not_equals" in when:
        return value != when["not_equals"], f"{where} is {shown}, the condition wants " \
                                            f"anything but {when['not_equals']!r}"
    if "in" in when:
        return value in when["in"], f"{where} is {shown}, the condition wants one of " \
                                    f"{', '.join(map(repr, when['in']))}"
    test = next(name for name in COMPARISONS if name in when)
    limit = when[test]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    wants = f"the condition wants a number {COMPARISONS[test][0]} {limit!r}"
    # A value that is not a number (missing, text) never passes a comparison.
    return (number and COMPARISONS[test][1](value, limit)), f"{where} is {shown}, {wants}"


def rule_applies(when: dict, shared_state: dict, params: dict) -> tuple[bool, str]:
    """(does an approval rule's `when` make it apply, why). A rule fails closed: a value
    that is missing, or not of the kind its test compares (a number for gt, text for
    equals "production"), cannot be read as "this rule does not apply", so the rule
    applies. `exists` asks about presence itself and is taken as it is."""
    holds, why = condition_holds(when, shared_state, params)
    if holds or "exists" in when:
        return holds, why
    _, value = _read(when, shared_state, params)
    if value is MISSING:
        return True, f"{why}; it is missing, so the rule applies"
    wanted = [when[t] for t in ("equals", "not_equals") if t in when] or list(
        when.get("in", [])) or [0]  # a comparison wants a number
    if not any(_same_kind(value, w) for w in wanted):
        return True, f"{why}; that is not the kind of value the rule tests, so it applies"
    return False, why


def _same_kind(value, wanted) -> bool:
    number = (int, float)
    if isinstance(value, bool) or isinstance(wanted, bool):
        return isinstance(value, bool) and isinstance(wanted, bool)
    if isinstance(value, number) and isinstance(wanted, number):
        return True
    return type(value) is type(wanted) or wanted is None


COMPARISONS = {
    "gt": ("above", lambda value, limit: value > limit),
    "gte": ("of at least", lambda value, limit: value >= limit),
    "lt": ("below", lambda value, limit: value < limit),
    "lte": ("of at most", lambda value, limit: value <= limit),
}


MAX_DELAY_SECONDS = 7 * 86400  # what spec validation allows; older rows are held to it too


def retry_delay(step, retry_number: int) -> float:
    """Seconds before automatic retry number `retry_number` (1-based) of a step."""
    base = min(float(step.retry_backoff_seconds), MAX_DELAY_SECONDS)
    if step.config.get("retry_backoff") == "exponential":
        cap = min(float(step.config.get("retry_backoff_max_seconds", 300)), MAX_DELAY_SECONDS)
        ceiling = min(cap, base * 2.0 ** min(retry_number - 1, 64))
        return random.uniform(ceiling / 2, ceiling)  # jitter spreads a burst of retries
    return base

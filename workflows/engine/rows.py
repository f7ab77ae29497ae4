"""Reading and writing a run's rows under its lock: the run, the acted step, the frontier.

A transition reads the step it acts on and the run's frontier (open, hard-failed and newly
ready steps), never the whole run, so it costs the same in a run of five steps and in one
of five thousand.
"""

from __future__ import annotations

from contextlib import contextmanager

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..models import STEP_FRONTIER, Run, Step
from .errors import NotFound
from .rules import RUN_HAS_HARD_FAILURE, ready_filter, settled

# The step columns a transition may change; a save writes only those that did.
STEP_COLUMNS = tuple(f.attname for f in Step._meta.concrete_fields if f.name != "updated_at")
# The run columns a transition may change.
RUN_COLUMNS = ("status", "shared_state", "error", "started_at", "finished_at", "current_step",
               "next_action", "checkpoint_seq", "updated_at")


def actor_of(actor) -> tuple[object | None, str]:
    """(user or None, the name the timeline shows) for a user, a system name or None."""
    if actor is None:
        return None, "system"
    if isinstance(actor, str):
        return None, actor
    return actor, actor.get_username()


def lock_run(run) -> Run:
    """The run row, locked until the transaction ends: it serialises the run's transitions."""
    run_id = run.pk if isinstance(run, Run) else run
    try:
        return Run.objects.select_for_update().get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"Run {run_id} does not exist.") from None


@contextmanager
def locked_by_step_id(step_id: int):
    """(run, step) in a transaction holding the run's lock; both None if the step is gone."""
    with transaction.atomic():
        # Lock only the run row (the step is read after the lock, so that it is current).
        run = (Run.objects.select_for_update(of=("self",)).filter(steps__pk=step_id)
               .order_by().first())
        yield run, run and load_step(run, pk=step_id)


def load_step(run: Run, **lookup) -> Step | None:
    """A step of a locked run, read after the lock so that it is current."""
    step = (Step.objects.filter(run=run, **lookup)
            .annotate(run_has_hard_failure=RUN_HAS_HARD_FAILURE).first())
    if step is not None:
        step.run = run
        # A commit saves only the columns that changed, and tells the step's dependents
        # when it settled or reopened.
        step.as_loaded = {name: getattr(step, name) for name in STEP_COLUMNS}
        step.settled_when_loaded = settled(step)
    return step


def step_of(run: Run, key: str) -> Step:
    """The step a transition acts on (the run row lock is already held)."""
    step = load_step(run, key=key)
    if step is None:
        raise NotFound(f"Run {run.pk} has no step {key!r}.")
    return step


def save_step(step: Step) -> None:
    changed = [name for name in STEP_COLUMNS if getattr(step, name) != step.as_loaded[name]]
    if changed:
        step.save(update_fields=[*changed, "updated_at"])
        step.as_loaded.update((name, getattr(step, name)) for name in changed)


def tell_dependents(run: Run, step: Step) -> None:
    """Keep the dependents' counts of unsettled dependencies as a step settles or reopens."""
    now_settled = settled(step)
    if now_settled != step.settled_when_loaded and step.dependents:
        Step.objects.filter(run=run, key__in=step.dependents).update(
            waiting_on=F("waiting_on") + (-1 if now_settled else 1))
        step.settled_when_loaded = now_settled


FRONTIER_FIELDS = (
    "id", "key", "index", "title", "status", "kind", "continue_on_failure", "attempt",
    "retry_after", "rung_at", "approval_group", "last_summary", "waiting_on", "waiting_since",
)
# What else a commit may change on a frontier step it does not act on (gates and wait steps
# starting to wait).
FRONTIER_WRITABLE = ("deadline_at",)


class StepState:
    """A light view of a frontier step: model instances would cost most of a commit."""

    __slots__ = (*FRONTIER_FIELDS, *FRONTIER_WRITABLE, "_dirty")

    def __init__(self, row) -> None:
        object.__setattr__(self, "_dirty", set())
        for name, value in zip(FRONTIER_FIELDS, row, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        self._dirty.add(name)

    @property
    def pk(self) -> int:
        return self.id

    def save(self) -> None:
        if self._dirty:
            changes = {name: getattr(self, name) for name in self._dirty}
            Step.objects.filter(pk=self.id).update(**changes, updated_at=timezone.now())
            self._dirty.clear()


def read_frontier(run: Run, query=STEP_FRONTIER, limit: int | None = None) -> list[StepState]:
    rows = Step.objects.filter(query, run=run).order_by("index").values_list(*FRONTIER_FIELDS)
    return [StepState(row) for row in (rows[:limit] if limit else rows)]


def first_ready(run: Run) -> StepState | None:
    rows = read_frontier(run, ready_filter(timezone.now()), 1)
    return rows[0] if rows else None

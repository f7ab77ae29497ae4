"""Runs inside runs: a `workflow` step opens a run of another spec and waits for it.

A worker claims the step like any other, then `start_child` opens the child run and turns
the step into a wait on it, both in one transaction under the parent's lock: a worker
killed before the commit leaves no child (the lease runs out and the step is retried), one
killed after it leaves exactly one. The step then holds no lease and no worker.

When the child run ends, its closing transition writes an outbox message (outbox.record),
delivered from the database even if the queue is down, and `child_ended` ends the parent's
step as the child ended: completed (the child's final shared state as evidence), failed
(retried while the step has retries, each retry a new child), or, for a cancelled child,
failed without retry. Cancelling the parent (or skipping the step) cancels the open child
the same way (`cancel_children`).

The child runs under the parent's goal, requested by whoever requested the parent (who
must still be allowed to start runs), with the active version of the named spec.
"""

from __future__ import annotations

import re

from django.conf import settings

from workflows.engine.commit import commit
from workflows.engine.moves import clear_lease
from workflows.engine.rows import locked
from workflows.engine.runs import cancel_run, open_run
from workflows.engine.steps import _fail, _reported_step
from workflows.errors import WorkflowError
from workflows.models import (
    OPEN_RUN_STATUSES,
    Checkpoint,
    CheckpointKind,
    Run,
    RunStatus,
    Step,
    StepStatus,
    WorkflowSpec,
)
from workflows.specs.values import PLACEHOLDER, as_is, fill, placeholder_value
from workflows.timing import clock

WHOLE_PLACEHOLDER = re.compile(r"^\s*" + PLACEHOLDER.pattern + r"\s*$")


def child_params(template: dict, shared_state: dict, params: dict) -> dict:
    """The child's params from the step's: "{{ params.x }}" alone passes the value as it is
    (a number stays a number); placeholders inside longer text are filled in."""
    def value(item):
        if isinstance(item, str):
            whole = WHOLE_PLACEHOLDER.match(item)
            if whole:
                return placeholder_value(whole, shared_state, params)
            return fill(item, shared_state, params, show=as_is)
        if isinstance(item, dict):
            return {k: value(v) for k, v in item.items()}
        if isinstance(item, list):
            return [value(v) for v in item]
        return item

    return {key: value(item) for key, item in template.items()}


def depth(run: Run) -> int:
    """How many runs up the chain of parents a run sits (0: a top-level run)."""
    levels, parent_step_id = 0, run.parent_step_id
    while parent_step_id is not None and levels <= settings.TOLLGATE_MAX_RUN_DEPTH:
        levels += 1
        parent_step_id = (Step.objects.filter(pk=parent_step_id)
                          .values_list("run__parent_step_id", flat=True).first())
    return levels


def start_child(run, key: str, *, lease_token: str, actor=None) -> Checkpoint:
    """Open the child run of a claimed `workflow` step and make the step wait for it, in one
    transaction. A stale lease records a stale result; a child that cannot be opened (no
    such spec, bad params, no right to start runs) fails the step without retry, saying why."""
    with locked(run, key=key) as state:
        step, stale = _reported_step(state, key, actor, lease_token, "complete", "approve")
        if stale:
            return stale
        run = state.run
        action = step.config["run"]
        name = action["workflow"]
        try:
            if depth(run) >= settings.TOLLGATE_MAX_RUN_DEPTH:
                raise WorkflowError(f"runs nest at most {settings.TOLLGATE_MAX_RUN_DEPTH} "
                                    "deep (TOLLGATE_MAX_RUN_DEPTH)")
            spec = WorkflowSpec.objects.filter(name=name, status="active").first()
            if spec is None:
                raise WorkflowError(f"no active spec named {name!r}")
            child = open_run(spec, actor=run.requested_by, goal=run.goal_id,
                             params=child_params(action.get("params", {}), run.shared_state,
                                                 run.params),
                             title=f"{step.title}, for run #{run.pk} {run.title}"[:200],
                             priority=run.priority, parent_step=step).run
        except WorkflowError as exc:
            step.finished_token = lease_token
            return _fail(state, step, actor, f"Could not open a {name} run: {exc}",
                         {"workflow": name}, retryable=False)
        clear_lease(step)  # waits for its child now, holding no worker
        step.finished_token = lease_token  # a repeated report of this claim is recorded
        step.child_run_id = child.pk
        return commit(state, CheckpointKind.CHILD_STARTED, actor=actor, step=step,
                      summary=f"Opened run {child.pk} ({spec}) and waits for it",
                      evidence={"child_run": child.pk, "workflow": name,
                                "params": child.params})


def child_ended(child_run_id: int) -> Checkpoint | None:
    """End the parent's step as its child run ended. Idempotent: a step that no longer
    waits for this child (ended already, retried, cancelled) is left alone."""
    child = Run.objects.filter(pk=child_run_id).values(
        "parent_step_id", "parent_step__run_id", "parent_step__key", "status",
        "shared_state").first()
    if child is None or child["parent_step_id"] is None or (
            child["status"] in OPEN_RUN_STATUSES):
        return None
    with locked(child["parent_step__run_id"], key=child["parent_step__key"]) as state:
        step = state.step(child["parent_step__key"])
        if step.status != StepStatus.RUNNING or step.child_run_id != child_run_id:
            return None
        ended = child["status"]
        evidence = {"child_run": child_run_id, "child_status": ended}
        actor = f"run {child_run_id}"
        if ended == RunStatus.COMPLETED:
            step.status = StepStatus.COMPLETED
            step.finished_at = clock.now()
            step.last_summary = f"Run {child_run_id} completed"
            step.last_evidence = {**evidence, "child_state": child["shared_state"]}
            return commit(state, CheckpointKind.CHILD_ENDED, actor=actor, step=step,
                          summary=step.last_summary, evidence=step.last_evidence)
        return _fail(state, step, actor, f"Run {child_run_id} {ended}", evidence,
                     retryable=ended == RunStatus.FAILED)


def child_gone(run_id: int, key: str, *, actor=None) -> Checkpoint | None:
    """End a step that waits for a child run no longer in the database (deleted by hand, or
    by a prune from before prunes waited for parents): it fails, retried while it has
    retries, as if its child had failed. None when the step waits for nothing missing."""
    with locked(run_id, key=key) as state:
        step = state.step(key)
        if (step.status != StepStatus.RUNNING or step.lease_token or step.child_run_id
                or "workflow" not in (step.config.get("run") or {})):
            return None
        return _fail(state, step, actor or "recover",
                     "Its child run is gone from the database", {"child_run": None},
                     retryable=True)


def open_children(run_id: int) -> list[int]:
    """The open child runs of a run's steps."""
    return list(Run.objects.filter(parent_step__run_id=run_id, status__in=OPEN_RUN_STATUSES)
                .values_list("pk", flat=True))


def cancel_children(run_id: int, reason: str) -> int:
    """Cancel the open child runs of a run that was cancelled (or whose waiting step was
    skipped), or that another step failed (unless the waiting step's `on_parent_failure`
    is "continue"): each is one transition of its own. Returns how many were cancelled."""
    failing = Step.objects.filter(run_id=run_id, status=StepStatus.FAILED,
                                  continue_on_failure=False).exists()
    cancelled = 0
    for child_id in open_children(run_id):
        parent_step = Step.objects.filter(child_run_id=child_id).values("status",
                                                                         "config").first()
        if parent_step and parent_step["status"] == StepStatus.RUNNING and not (
                failing and (parent_step["config"].get("run") or {}).get(
                    "on_parent_failure") != "continue"):
            continue  # its step waits for it again (retried): not ours to cancel
        cancelled += cancel_run(child_id, reason=reason) is not None
    return cancelled

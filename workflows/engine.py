"""The transition engine: every status change of a run or step goes through these functions.

Each public transition is one database transaction that locks the run row, checks the move
is legal, applies it and appends exactly one checkpoint. The run row lock serialises every
transition of a run, so two workers, two clicks or two API calls cannot both win, and the
checkpoint sequence stays gapless. Work that must follow a commit (ringing the queue for
newly ready steps) is registered with `transaction.on_commit`.

A transition reads the step it acts on and the run's frontier (open, hard-failed and newly
ready steps), never the whole run: each step keeps its dependents and a count of its
unsettled dependencies, updated when a step settles or reopens. So a transition costs the
same in a run of five steps and in one of five thousand.
"""

from __future__ import annotations

import random
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from goals.models import Goal

from . import permissions
from .models import (
    OPEN_STEP_STATUSES,
    STEP_FRONTIER,
    Approval,
    Checkpoint,
    Decision,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    WorkflowSpec,
)
from .values import BadValue, check_json


class WorkflowError(Exception):
    """A transition that cannot happen now; nothing was changed."""

    status_code = 409


class IllegalTransition(WorkflowError):
    status_code = 409


class NotPermitted(WorkflowError):
    status_code = 403


class InvalidInput(WorkflowError):
    status_code = 400


class NotFound(WorkflowError):
    status_code = 404


# --- helpers ------------------------------------------------------------------------------

def _actor(actor) -> tuple[object | None, str]:
    if actor is None:
        return None, "system"
    if isinstance(actor, str):
        return None, actor
    return actor, actor.get_username()


def _lock(run) -> Run:
    """The run row, locked until the transaction ends: it serialises the run's transitions."""
    run_id = run.pk if isinstance(run, Run) else run
    try:
        return Run.objects.select_for_update().get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"Run {run_id} does not exist.") from None


def _settled(step) -> bool:
    return step.status in (StepStatus.COMPLETED, StepStatus.SKIPPED) or (
        step.status == StepStatus.FAILED and step.continue_on_failure
    )


def _load(run: Run, **lookup) -> Step | None:
    """A step of a locked run, read after the lock so that it is current."""
    step = (Step.objects.filter(run=run, **lookup)
            .annotate(run_has_hard_failure=RUN_HAS_HARD_FAILURE).first())
    if step is not None:
        step.run = run
        # A commit saves only the columns that changed, and tells the step's dependents
        # when it settled or reopened.
        step.as_loaded = {name: getattr(step, name) for name in STEP_COLUMNS}
        step.settled_when_loaded = _settled(step)
    return step


STEP_COLUMNS = tuple(f.attname for f in Step._meta.concrete_fields if f.name != "updated_at")
# The run columns a transition may change.
RUN_COLUMNS = ("status", "shared_state", "error", "started_at", "finished_at", "current_step",
               "next_action", "checkpoint_seq", "updated_at")


def _save_step(step: Step) -> None:
    changed = [name for name in STEP_COLUMNS if getattr(step, name) != step.as_loaded[name]]
    if changed:
        step.save(update_fields=[*changed, "updated_at"])
        step.as_loaded.update((name, getattr(step, name)) for name in changed)


def _step(run: Run, key: str) -> Step:
    """The step a transition acts on (the run row lock is already held)."""
    step = _load(run, key=key)
    if step is None:
        raise NotFound(f"Run {run.pk} has no step {key!r}.")
    return step


SETTLED = Q(status__in=[StepStatus.COMPLETED, StepStatus.SKIPPED]) | Q(
    status=StepStatus.FAILED, continue_on_failure=True)
FRONTIER_FIELDS = (
    "id", "key", "index", "title", "status", "kind", "continue_on_failure", "attempt",
    "retry_after", "rung_at", "approval_group", "last_summary", "waiting_on",
)
# What a commit may change on a frontier step it does not act on (gates opening or closing).
FRONTIER_WRITABLE = ("waiting_since", "deadline_at")


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


def _frontier(run: Run, query=STEP_FRONTIER, limit: int | None = None) -> list[StepState]:
    rows = Step.objects.filter(query, run=run).order_by("index").values_list(*FRONTIER_FIELDS)
    return [StepState(row) for row in (rows[:limit] if limit else rows)]


def _tell_dependents(run: Run, step: Step) -> None:
    """Keep the dependents' counts of unsettled dependencies as a step settles or reopens."""
    settled = _settled(step)
    if settled != step.settled_when_loaded and step.dependents:
        Step.objects.filter(run=run, key__in=step.dependents).update(
            waiting_on=F("waiting_on") + (-1 if settled else 1))
        step.settled_when_loaded = settled


def _hard_failure(steps) -> Step | None:
    for step in steps:
        if step.status == StepStatus.FAILED and not step.continue_on_failure:
            return step
    return None


# For a step row: does its run have a failed step that holds the run back?
RUN_HAS_HARD_FAILURE = Exists(Step.objects.filter(
    run=OuterRef("run"), status=StepStatus.FAILED, continue_on_failure=False))


def _require_operator(actor, action: str) -> None:
    """A person must hold the operator permission; the system (None or a name) may act."""
    if permissions.is_person(actor) and not permissions.can_operate(actor):
        raise NotPermitted(f"{_actor(actor)[1]} may not {action}: that needs the operator "
                           "permission.")


def _require_open(run: Run, action: str) -> None:
    if run.is_terminal:
        raise IllegalTransition(f"Cannot {action}: run {run.pk} is {run.status}.")


def _run_status(run: Run, frontier, *, unsettled: bool, moved: bool) -> str:
    if run.status == RunStatus.CANCELLED:
        return RunStatus.CANCELLED
    if not unsettled:
        return RunStatus.COMPLETED
    statuses = {step.status for step in frontier}
    active = bool(statuses & {StepStatus.RUNNING, StepStatus.RETRYING})
    if active:
        return RunStatus.RUNNING
    if _hard_failure(frontier):
        return RunStatus.FAILED
    if StepStatus.WAITING_APPROVAL in statuses:
        return RunStatus.WAITING_APPROVAL
    if StepStatus.BLOCKED in statuses:
        return RunStatus.BLOCKED
    return RunStatus.RUNNING if moved else RunStatus.OPEN


def _steps(steps) -> list:
    return list(steps.values() if isinstance(steps, dict) else steps)


def derive_run_status(run: Run, steps) -> str:
    """The run's status as all of its steps imply it (commits derive it from the frontier)."""
    steps = _steps(steps)
    return _run_status(
        run, steps, unsettled=not all(_settled(step) for step in steps),
        moved=any(step.attempt > 0 or step.status == StepStatus.SKIPPED for step in steps))


def _is_ready(step, now) -> bool:
    if step.kind != StepKind.RUN:
        return False
    if step.status == StepStatus.PENDING:
        return step.waiting_on == 0
    return step.status == StepStatus.RETRYING and (
        step.retry_after is None or step.retry_after <= now)


def ready_filter(now) -> Q:
    """Worker steps that may start at `now`, short of the run's state (see ready_steps)."""
    due = Q(retry_after__isnull=True) | Q(retry_after__lte=now)
    return Q(kind=StepKind.RUN) & (
        Q(status=StepStatus.PENDING, waiting_on=0) | Q(status=StepStatus.RETRYING) & due)


def ready_steps(run: Run, steps, now=None) -> list:
    """Worker steps that may start now, among all of a run's steps (or its frontier)."""
    steps = _steps(steps)
    if run.is_terminal or _hard_failure(steps):
        return []
    now = now or timezone.now()
    return [step for step in steps if _is_ready(step, now)]


def _may_start(run: Run, step: Step, now) -> bool:
    return not (run.is_terminal or step.run_has_hard_failure) and _is_ready(step, now)


def retry_delay(step: Step, retry_number: int) -> float:
    """Seconds before automatic retry number `retry_number` (1-based) of a step."""
    base = step.retry_backoff_seconds
    if step.config.get("retry_backoff") == "exponential":
        cap = float(step.config.get("retry_backoff_max_seconds", 300))
        ceiling = min(cap, base * 2 ** (retry_number - 1))
        return random.uniform(ceiling / 2, ceiling)  # jitter spreads a burst of retries
    return base


def _clear_lease(step: Step) -> None:
    step.lease_owner = ""
    step.lease_token = ""
    step.lease_expires_at = None


def _open_gate(gate: Step, now) -> None:
    """A gate starts waiting on its group, with its deadline if the spec sets one."""
    config = gate.config if isinstance(gate, Step) else (
        Step.objects.filter(pk=gate.pk).values_list("config", flat=True).first() or {})
    approval = config.get("approval", {})
    gate.status = StepStatus.WAITING_APPROVAL
    gate.attempt = max(gate.attempt, 1)
    gate.waiting_since = now
    timeout = approval.get("timeout_seconds")
    gate.deadline_at = now + timedelta(seconds=timeout) if timeout else None


def _close_gate(gate: Step) -> None:
    gate.deadline_at = None


def _check_value(value, where: str) -> None:
    try:
        check_json(value, where)
    except BadValue as exc:
        raise InvalidInput(str(exc)) from None


def _merge_state(run: Run, patch) -> dict:
    if patch in (None, {}):
        return {}
    if not isinstance(patch, dict):
        raise InvalidInput("state_patch must be a JSON object.")
    _check_value(patch, "state_patch")
    run.shared_state = {**(run.shared_state or {}), **patch}
    return patch


def _next_action(frontier, ready) -> tuple[str, str]:
    """(current step key, what happens next) for display and the API."""
    for step in frontier:
        if step.status == StepStatus.WAITING_APPROVAL:
            return step.key, f"Approve {step.title} ({step.approval_group} group)"
        if step.status == StepStatus.RUNNING:
            return step.key, f"{step.title} is running"
        if step.status == StepStatus.BLOCKED:
            return step.key, f"{step.title} is blocked: {step.last_summary}".strip()
        if step.status == StepStatus.RETRYING:
            return step.key, f"{step.title} will retry"
    failed = _hard_failure(frontier)
    if failed:
        return failed.key, f"{failed.title} failed; retry or cancel"
    if ready is not None:
        return ready.key, f"{ready.title} is ready to start"
    return "", ""


def _commit(
    run: Run,
    kind: str,
    *,
    actor,
    step: Step | None = None,
    summary: str = "",
    evidence: dict | None = None,
    state_patch: dict | None = None,
) -> Checkpoint:
    """Save the acted step, settle what follows from it and append the one checkpoint."""
    now = timezone.now()
    if step is not None:
        _save_step(step)
        _tell_dependents(run, step)
    frontier = [step if step is not None and row.key == step.key else row
                for row in _frontier(run)]
    failed = _hard_failure(frontier)
    activated, resave = [], []
    if run.status != RunStatus.CANCELLED and not failed:
        for gate in frontier:
            if gate.kind == StepKind.APPROVAL and gate.status == StepStatus.PENDING:
                _open_gate(gate, now)
                activated.append(gate.key)
                resave.append(gate)
    busy = any(s.status != StepStatus.PENDING for s in frontier)
    # The ready step to name: the first not yet rung, else (ready steps already rung are
    # not in the frontier) the first one at all, looked up when nothing else is open.
    ready = next((s for s in frontier
                  if s.kind == StepKind.RUN and s.status == StepStatus.PENDING), None)
    if ready is None and not busy:
        ready = _first_ready(run)
    unsettled = busy or ready is not None or Step.objects.filter(run=run).exclude(
        SETTLED).exists()
    previous_status = run.status
    moved = run.started_at is not None or (step is not None and (
        step.attempt > 0 or step.status == StepStatus.SKIPPED))
    run.status = _run_status(run, frontier, unsettled=unsettled, moved=moved)
    if run.status == RunStatus.FAILED:
        # A failed run waits on nobody: its open gates go back to pending until a retry.
        for gate in frontier:
            if gate.status == StepStatus.WAITING_APPROVAL:
                gate.status = StepStatus.PENDING
                gate.waiting_since = None
                _close_gate(gate)
                resave.append(gate)
    if run.is_terminal:
        run.finished_at = run.finished_at or now
    else:
        run.finished_at = None
        run.error = ""
    if run.started_at is None and run.status != RunStatus.OPEN:
        run.started_at = now
    run.current_step, run.next_action = _next_action(frontier, ready)
    for gate in resave:
        if isinstance(gate, Step):
            _save_step(gate)
        else:
            gate.save()
    run.checkpoint_seq += 1
    run.save(update_fields=RUN_COLUMNS)
    user, name = _actor(actor)
    if activated:
        evidence = {**(evidence or {}), "gates_opened": activated}
    checkpoint = Checkpoint.objects.create(
        run=run,
        seq=run.checkpoint_seq,
        kind=kind,
        step=step,
        run_status=run.status,
        step_status=step.status if step else "",
        actor=user,
        actor_name=name,
        summary=summary[:10000],
        evidence=evidence or {},
        state_patch=state_patch or {},
        at=now,
    )
    ring = [s.pk for s in frontier if s.kind == StepKind.RUN and s.status == StepStatus.PENDING
            and s.rung_at is None] if not (run.is_terminal or failed) else []
    retry = [(s.pk, s.retry_after) for s in frontier
             if s.status == StepStatus.RETRYING and s.rung_at is None and s.retry_after]
    from . import hooks

    hooks.after_transition(run, checkpoint, previous_status=previous_status, ring=ring,
                           retry=retry)
    return checkpoint


def _first_ready(run: Run) -> StepState | None:
    rows = _frontier(run, ready_filter(timezone.now()), 1)
    return rows[0] if rows else None


# --- transitions --------------------------------------------------------------------------

@dataclass(frozen=True)
class Opened:
    run: Run
    reused: bool


def open_run(
    spec: WorkflowSpec | str,
    *,
    actor=None,
    goal: Goal | int | None = None,
    idempotency_key: str = "",
    shared_state: dict | None = None,
    title: str = "",
    priority: str | None = None,
) -> Opened:
    """Open a run of a spec (its active version when given by name).

    With an idempotency key already used by an open run of the same spec, that run is
    returned and marked reused; the database's partial unique index settles races.
    """
    if permissions.is_person(actor) and not permissions.has(actor, permissions.START):
        raise NotPermitted(f"{_actor(actor)[1] or 'anonymous'} may not start runs.")
    if isinstance(spec, str):
        spec_obj = WorkflowSpec.objects.filter(name=spec, status="active").first()
        if spec_obj is None:
            raise NotFound(f"No active spec named {spec!r}.")
        spec = spec_obj
    elif spec.status != "active":
        raise IllegalTransition(f"Spec {spec} is archived; start its active version.")
    if shared_state is not None and not isinstance(shared_state, dict):
        raise InvalidInput("shared_state must be a JSON object.")
    _check_value(shared_state, "shared_state")
    idempotency_key = (idempotency_key or "").strip()
    if len(idempotency_key) > 200:
        raise InvalidInput("idempotency_key is longer than 200 characters.")
    if goal is not None and not isinstance(goal, Goal):
        goal_obj = Goal.objects.filter(pk=goal).first() if str(goal).isdigit() else None
        if goal_obj is None:
            raise NotFound(f"Goal {goal} does not exist.")
        goal = goal_obj
    if goal is not None and goal.is_closed:
        raise IllegalTransition(f"Goal {goal.pk} ({goal.title}) is {goal.status}; "
                                "runs cannot be opened under a closed goal.")
    if idempotency_key:
        existing = _open_run_with_key(spec.name, idempotency_key)
        if existing:
            return Opened(existing, True)
    user, _ = _actor(actor)
    try:
        with transaction.atomic():
            run = Run.objects.create(
                spec=spec,
                spec_name=spec.name,
                goal=goal,
                title=title or spec.description or spec.name,
                priority=priority or (goal.priority if goal else "normal"),
                requested_by=user,
                idempotency_key=idempotency_key,
                shared_state=shared_state or {},
            )
            Step.objects.bulk_create(_new_steps(run, spec.definition["steps"]))
            _commit(run, "run_opened", actor=actor,
                    summary=f"Opened {spec} run" + (f" under goal {goal.pk}" if goal else ""),
                    state_patch=shared_state or {})
    except IntegrityError:
        existing = _open_run_with_key(spec.name, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return Opened(existing, True)
    return Opened(run, False)


def _new_steps(run: Run, items: list[dict]) -> list[Step]:
    dependents: dict[str, list[str]] = {item["key"]: [] for item in items}
    for item in items:
        for dep in item.get("depends_on", []):
            dependents[dep].append(item["key"])
    steps = []
    for index, item in enumerate(items):
        approval = item.get("approval") or {}
        steps.append(Step(
            run=run,
            key=item["key"],
            title=item.get("title") or item["key"],
            index=index,
            depends_on=item.get("depends_on", []),
            dependents=dependents[item["key"]],
            waiting_on=len(item.get("depends_on", [])),
            kind=StepKind.APPROVAL if approval else StepKind.RUN,
            config=item,
            continue_on_failure=item.get("continue_on_failure", False),
            max_retries=item.get("max_retries", 0),
            retry_backoff_seconds=item.get("retry_backoff_seconds", 0),
            approval_group=approval.get("group", ""),
            approval_required=approval.get("required", 1),
            allow_self_approval=approval.get("allow_self_approval", False),
            compensation=item.get("compensation"),
        ))
    return steps


def _open_run_with_key(spec_name: str, key: str) -> Run | None:
    from .models import OPEN_RUN_STATUSES

    return Run.objects.filter(
        spec_name=spec_name, idempotency_key=key, status__in=OPEN_RUN_STATUSES
    ).first()


def start_step(run, key: str, *, actor=None, owner: str = "", lease_seconds=None) -> Step:
    """Move a ready worker step to running, taking a lease when `lease_seconds` is given."""
    with transaction.atomic():
        run = _lock(run)
        return _start(run, _step(run, key), actor, owner, lease_seconds)


def claim_step(step_id: int, *, owner: str, lease_seconds: float) -> Step:
    """A worker starts the step it was rung for, under a lease (see start_step)."""
    with _locked_by_step_id(step_id) as (run, step):
        if step is None:
            raise NotFound(f"Step {step_id} does not exist.")
        return _start(run, step, f"worker {owner}", owner, lease_seconds)


def _start(run: Run, step: Step, actor, owner: str, lease_seconds) -> Step:
    key = step.key
    _require_open(run, f"start {key}")
    if step.kind == StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is an approval gate; it is decided, not started.")
    now = timezone.now()
    if not _may_start(run, step, now):
        if step.status == StepStatus.RETRYING:
            raise IllegalTransition(f"{key} retries at {step.retry_after:%H:%M:%S}, not yet.")
        if step.status == StepStatus.PENDING:
            raise IllegalTransition(f"{key} is waiting on its dependencies.")
        raise IllegalTransition(f"Cannot start {key}: it is {step.status}.")
    step.status = StepStatus.RUNNING
    step.attempt += 1
    step.started_at = now
    step.finished_at = None
    step.retry_after = None
    if lease_seconds:
        step.lease_owner = owner[:200]
        step.lease_token = uuid.uuid4().hex
        step.lease_expires_at = now + timedelta(seconds=lease_seconds)
    _commit(run, "step_started", actor=actor, step=step,
            summary=f"Attempt {step.attempt}" + (f" on {owner}" if owner else ""),
            evidence={"attempt": step.attempt, "owner": owner} if owner else
            {"attempt": step.attempt})
    return step


def _stale(run, step, actor, lease_token, what: str) -> Checkpoint:
    return _commit(
        run, "stale_result", actor=actor, step=step,
        summary=f"Ignored a {what} result for {step.key}: its lease was lost "
                f"(step is {step.status}).",
        evidence={"token": lease_token, "current_token": step.lease_token},
    )


def _reported_step(run, key: str, actor, lease_token, verb: str, gate_verb: str):
    """(step, None) for a step a worker or agent may report on now, or (step, checkpoint)
    when the report carries a lease token that is no longer current."""
    step = _step(run, key)
    if lease_token is not None and (
        step.lease_token != lease_token or step.status != StepStatus.RUNNING
    ):
        outcome = {"complete": "completed", "fail": "failed"}[verb]
        return step, _stale(run, step, actor, lease_token, outcome)
    _require_open(run, f"{verb} {key}")
    if step.kind == StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is an approval gate; {gate_verb} it instead.")
    if step.status not in (StepStatus.RUNNING, StepStatus.BLOCKED):
        raise IllegalTransition(f"Cannot {verb} {key}: it is {step.status}.")
    return step, None


def complete_step(run, key: str, *, actor=None, summary: str = "", evidence=None,
                  state_patch=None, lease_token: str | None = None) -> Checkpoint:
    """Finish a running step successfully, merging its state patch into the run."""
    with transaction.atomic():
        run = _lock(run)
        step, stale = _reported_step(run, key, actor, lease_token, "complete", "approve")
        if stale:
            return stale
        patch = _merge_state(run, state_patch)
        step.status = StepStatus.COMPLETED
        step.finished_at = timezone.now()
        step.last_summary = summary
        step.last_evidence = evidence or {}
        step.last_state_patch = patch
        _clear_lease(step)
        return _commit(run, "step_completed", actor=actor, step=step,
                       summary=summary or f"{step.title} completed",
                       evidence=evidence, state_patch=patch)


def fail_step(run, key: str, *, actor=None, summary: str = "", evidence=None,
              lease_token: str | None = None, retryable: bool = True) -> Checkpoint:
    """Fail a running step: it retries while attempts remain, else it fails."""
    with transaction.atomic():
        run = _lock(run)
        step, stale = _reported_step(run, key, actor, lease_token, "fail", "reject")
        if stale:
            return stale
        return _fail(run, step, actor, summary, evidence, retryable)


def _fail(run, step, actor, summary, evidence, retryable=True) -> Checkpoint:
    now = timezone.now()
    _clear_lease(step)
    step.last_summary = summary
    step.last_evidence = evidence or {}
    retries_used = step.attempt - step.attempt_base - 1
    if retryable and retries_used < step.max_retries:
        delay = retry_delay(step, retries_used + 1)
        step.status = StepStatus.RETRYING
        step.retry_after = now + timedelta(seconds=delay)
        step.rung_at = None  # the retry needs a doorbell of its own
        return _commit(run, "step_retrying", actor=actor, step=step,
                       summary=f"{summary or 'Failed'}; retry {retries_used + 1} of "
                               f"{step.max_retries} in {delay:.1f}s",
                       evidence={**(evidence or {}), "retry_after": step.retry_after.isoformat()})
    step.status = StepStatus.FAILED
    step.finished_at = now
    if not step.continue_on_failure:
        run.error = f"{step.title}: {summary or 'failed'}"
    return _commit(run, "step_failed", actor=actor, step=step,
                   summary=summary or f"{step.title} failed", evidence=evidence)


def _check_approver(run: Run, step: Step, user) -> None:
    groups = set(user.groups.values_list("name", flat=True)) if permissions.is_person(
        user) and user.is_authenticated else set()
    refusal = permissions.decide_refusal(user, run, step, groups=groups)
    if refusal:
        raise NotPermitted(refusal)


def _gate(run, key, user, verb: str) -> Step:
    step = _step(run, key)
    _require_open(run, f"{verb} {key}")
    if step.kind != StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is not an approval gate.")
    if step.status != StepStatus.WAITING_APPROVAL:
        raise IllegalTransition(f"Cannot {verb} {key}: it is {step.status}, "
                                "not waiting for approval.")
    _check_approver(run, step, user)
    if Approval.objects.filter(step=step, attempt=step.attempt, user=user).exists():
        raise IllegalTransition(f"{user.get_username()} has already decided {key}.")
    return step


def _record_decision(step: Step, user, decision: str, comment: str) -> Approval:
    now = timezone.now()
    waited = (now - step.waiting_since).total_seconds() if step.waiting_since else None
    return Approval.objects.create(step=step, attempt=step.attempt, user=user, decision=decision,
                                   comment=comment, group=step.approval_group,
                                   waited_seconds=waited, at=now)


def approve(run, key: str, *, user, comment: str = "") -> Checkpoint:
    """Record an approval; the gate completes when its quorum of distinct approvers is met."""
    with transaction.atomic():
        run = _lock(run)
        step = _gate(run, key, user, "approve")
        _record_decision(step, user, Decision.APPROVE, comment)
        count = Approval.objects.filter(
            step=step, attempt=step.attempt, decision=Decision.APPROVE
        ).count()
        evidence = {"approvals": count, "required": step.approval_required}
        if count >= step.approval_required:
            _close_gate(step)
            step.status = StepStatus.COMPLETED
            step.finished_at = timezone.now()
            step.last_summary = comment
            return _commit(run, "step_approved", actor=user, step=step,
                           summary=comment or f"Approved ({count} of {step.approval_required})",
                           evidence=evidence)
        return _commit(run, "approval_recorded", actor=user, step=step,
                       summary=comment or f"Approved ({count} of {step.approval_required})",
                       evidence=evidence)


def reject(run, key: str, *, user, comment: str) -> Checkpoint:
    """Reject a gate: it fails, with the comment as its reason."""
    if not (comment or "").strip():
        raise InvalidInput("A comment is required to reject.")
    with transaction.atomic():
        run = _lock(run)
        step = _gate(run, key, user, "reject")
        _record_decision(step, user, Decision.REJECT, comment)
        _close_gate(step)
        step.status = StepStatus.FAILED
        step.finished_at = timezone.now()
        step.last_summary = comment
        if not step.continue_on_failure:
            run.error = f"{step.title} rejected by {user.get_username()}: {comment}"
        return _commit(run, "step_rejected", actor=user, step=step, summary=comment)


def retry_step(run, key: str, *, actor=None) -> Checkpoint:
    """Try a failed step again; a gate asks for fresh approvals."""
    _require_operator(actor, f"retry {key}")
    with transaction.atomic():
        run = _lock(run)
        step = _step(run, key)
        if run.status == RunStatus.CANCELLED:
            raise IllegalTransition(f"Cannot retry {key}: run {run.pk} is cancelled.")
        if step.status != StepStatus.FAILED:
            raise IllegalTransition(f"Cannot retry {key}: it is {step.status}; "
                                    "only a failed step can be retried.")
        step.finished_at = None
        step.retry_after = None
        if step.kind == StepKind.APPROVAL:
            step.attempt += 1
            step.approval_group = step.config["approval"]["group"]
            step.escalated_at = None
            _open_gate(step, timezone.now())
        else:
            step.status = StepStatus.PENDING
            step.attempt_base = step.attempt  # a fresh window of automatic retries
            step.rung_at = None
        return _commit(run, "step_retried", actor=actor, step=step,
                       summary=f"Retry of {step.title} requested")


def skip_step(run, key: str, *, actor=None, reason: str = "") -> Checkpoint:
    """Skip a work step that is not running; its dependants may go on.

    A gate is never skipped, whoever asks: only its approvers pass it, under its quorum.
    """
    with transaction.atomic():
        run = _lock(run)
        step = _step(run, key)
        if step.kind == StepKind.APPROVAL:
            raise IllegalTransition(f"{key} is an approval gate: it is decided by the "
                                    f"{step.approval_group} group, never skipped.")
        _require_operator(actor, f"skip {key}")
        # A failed run stays failed until a retry: skipping is for runs still in motion.
        _require_open(run, f"skip {key}")
        if step.status in (StepStatus.RUNNING, StepStatus.COMPLETED, StepStatus.SKIPPED,
                           StepStatus.CANCELLED):
            raise IllegalTransition(f"Cannot skip {key}: it is {step.status}.")
        step.status = StepStatus.SKIPPED
        _close_gate(step)
        step.finished_at = timezone.now()
        step.last_summary = reason
        _clear_lease(step)
        return _commit(run, "step_skipped", actor=actor, step=step,
                       summary=reason or f"{step.title} skipped")


def cancel_run(run, *, actor=None, reason: str = "") -> Checkpoint | None:
    """Cancel a run and its open steps. Cancelling a cancelled run changes nothing."""
    _require_operator(actor, "cancel runs")
    with transaction.atomic():
        run = _lock(run)
        if run.status == RunStatus.CANCELLED:
            return None
        _require_open(run, "cancel")
        now = timezone.now()
        open_steps = Step.objects.filter(run=run, status__in=OPEN_STEP_STATUSES)
        cancelled = list(open_steps.order_by("index").values_list("key", flat=True))
        # Keep lease tokens: a worker's heartbeat sees its step cancelled and stops the process.
        closed = {"status": StepStatus.CANCELLED, "lease_expires_at": None, "deadline_at": None,
                  "updated_at": now}
        open_steps.filter(Q(status=StepStatus.RUNNING) | Q(started_at__isnull=False)).update(
            **closed, finished_at=now)
        open_steps.update(**closed, finished_at=None)  # the rest never started
        run.status = RunStatus.CANCELLED
        run.error = reason
        return _commit(run, "run_cancelled", actor=actor, summary=reason or "Run cancelled",
                       evidence={"cancelled_steps": cancelled})


AGENT_STATUSES = ("running", "completed", "failed", "blocked")


def record_transition(run, key: str, *, actor=None, step_status: str | None = None,
                      summary: str = "", evidence=None, state_patch=None) -> Checkpoint:
    """An agent reports progress on a step it performs itself (no worker involved)."""
    if step_status not in (None, "", *AGENT_STATUSES):
        raise InvalidInput(f"step_status must be one of {', '.join(AGENT_STATUSES)}, "
                           f"got {step_status!r}.")
    if evidence is not None and not isinstance(evidence, dict):
        raise InvalidInput("evidence must be a JSON object.")
    _check_value(evidence, "evidence")
    with transaction.atomic():
        run = _lock(run)
        if permissions.is_person(actor) and run.requested_by_id != actor.pk and not (
                permissions.can_operate(actor)):
            raise NotPermitted(f"Only the run's requester or an operator may report on run "
                               f"{run.pk}.")
        step = _step(run, key)
        _require_open(run, f"report on {key}")
        if step.kind == StepKind.APPROVAL:
            raise IllegalTransition(f"{key} is an approval gate; approvers decide it.")
        now = timezone.now()
        ready = _may_start(run, step, now)
        current = step.status
        if step_status in (None, ""):
            if current in (StepStatus.COMPLETED, StepStatus.SKIPPED, StepStatus.CANCELLED):
                raise IllegalTransition(f"Cannot report on {key}: it is {current}.")
        elif current == StepStatus.RUNNING and step.lease_token:
            raise IllegalTransition(f"{key} is being run by a worker ({step.lease_owner}).")
        elif step_status == "running":
            if not (ready or current == StepStatus.BLOCKED):
                raise IllegalTransition(f"Cannot start {key}: it is {current}"
                                        + (" and waiting on dependencies."
                                           if current == StepStatus.PENDING else "."))
            if current != StepStatus.BLOCKED:
                step.attempt += 1
                step.started_at = now
            step.status = StepStatus.RUNNING
        else:
            if not (ready or current in (StepStatus.RUNNING, StepStatus.BLOCKED)):
                raise IllegalTransition(f"Cannot mark {key} {step_status}: it is {current}"
                                        + (" and waiting on dependencies."
                                           if current == StepStatus.PENDING else "."))
            if ready:
                step.attempt += 1
                step.started_at = now
            step.status = step_status
            if step_status in ("completed", "failed"):
                step.finished_at = now
            if step_status == "failed" and not step.continue_on_failure:
                run.error = f"{step.title}: {summary or 'failed'}"
        patch = _merge_state(run, state_patch)
        step.last_summary = summary or step.last_summary
        if evidence:
            step.last_evidence = evidence
        if patch:
            step.last_state_patch = patch
        return _commit(run, "transition", actor=actor, step=step,
                       summary=summary or f"{step.title}: {step.status}",
                       evidence=evidence, state_patch=patch)


# --- leases (workers) ---------------------------------------------------------------------

def renew_lease(step_id: int, token: str, seconds: float) -> bool:
    """Extend a live lease; False when the step is no longer running under this token."""
    return bool(
        Step.objects.filter(pk=step_id, lease_token=token, status=StepStatus.RUNNING).update(
            lease_expires_at=timezone.now() + timedelta(seconds=seconds)
        )
    )


@contextmanager
def _locked_by_step_id(step_id: int):
    """(run, step) in a transaction holding the run's lock; both None if the step is gone."""
    with transaction.atomic():
        # Lock only the run row (the step is read after the lock, so that it is current).
        run = (Run.objects.select_for_update(of=("self",)).filter(steps__pk=step_id)
               .order_by().first())
        yield run, run and _load(run, pk=step_id)


def expire_lease(step_id: int) -> Checkpoint | None:
    """The sweeper's move: a running step whose lease ran out retries or fails."""
    with _locked_by_step_id(step_id) as (run, step):
        now = timezone.now()
        if (step is None or step.status != StepStatus.RUNNING or step.lease_expires_at is None
                or step.lease_expires_at > now):
            return None  # renewed, finished or already swept
        owner = step.lease_owner
        return _fail(run, step, f"sweeper ({owner})" if owner else "sweeper",
                     f"Lease of {owner or 'its worker'} expired; the worker is presumed dead",
                     {"lease_owner": owner, "expired_at": step.lease_expires_at.isoformat()})


def record_compensation(run, key: str, *, ok: bool, summary: str = "",
                        evidence=None) -> Checkpoint:
    """Put a compensation's outcome on the failed run's timeline; no status changes."""
    with transaction.atomic():
        run = _lock(run)
        step = _step(run, key)
        return _commit(run, "compensated" if ok else "compensation_failed", actor=None,
                       step=step, evidence=evidence,
                       summary=f"Compensation of {step.title}: {summary}")


def expire_gate(step_id: int) -> Checkpoint | None:
    """A gate past its deadline is rejected or escalated, as its spec says."""
    with _locked_by_step_id(step_id) as (run, step):
        now = timezone.now()
        if (step is None or step.status != StepStatus.WAITING_APPROVAL or run.is_terminal
                or step.deadline_at is None or step.deadline_at > now):
            return None  # decided, moved on or not due
        approval = step.config.get("approval", {})
        waited = f"{(now - step.waiting_since).total_seconds():.0f}s" if step.waiting_since else ""
        if approval.get("on_timeout") == "escalate" and not step.escalated_at:
            previous = step.approval_group
            step.approval_group = approval["escalate_to"]
            step.escalated_at = now
            _close_gate(step)
            return _commit(run, "gate_escalated", actor="deadline", step=step,
                           summary=f"No decision from {previous} after {waited}; escalated to "
                                   f"{step.approval_group}",
                           evidence={"from_group": previous, "to_group": step.approval_group})
        _close_gate(step)
        step.status = StepStatus.FAILED
        step.finished_at = now
        step.last_summary = f"No decision from {step.approval_group} after {waited}"
        if not step.continue_on_failure:
            run.error = f"{step.title}: timed out waiting for approval"
        return _commit(run, "gate_timed_out", actor="deadline", step=step,
                       summary=step.last_summary)


# --- reading ------------------------------------------------------------------------------

def resume_state(run) -> dict:
    """Where a run stands and what would move it on, for scripts and agents."""
    run_id = run.pk if isinstance(run, Run) else run
    run = Run.objects.filter(pk=run_id).first() if str(run_id).isdigit() else None
    if run is None:
        raise NotFound(f"Run {run_id} does not exist.")
    steps = {s.key: s for s in run.steps.order_by("index")}

    def answer(state, can, step=None, message=""):
        return {"resume_state": state, "can_resume": can,
                "next_step": step.key if step else None, "message": message}

    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")
    failed = _hard_failure(steps.values())
    if run.status == RunStatus.FAILED and failed:
        return answer("retry_available", True, failed,
                      f"{failed.title} failed ({failed.last_summary or 'no reason given'}); "
                      "retry it to resume the run.")
    for step in steps.values():
        if step.status == StepStatus.WAITING_APPROVAL:
            count = step.approvals.filter(attempt=step.attempt, decision="approve").count()
            return answer("waiting_approval", False, step,
                          f"{step.title} waits for {step.approval_required - count} more "
                          f"approval(s) from the {step.approval_group} group.")
    for step in steps.values():
        if step.status == StepStatus.RUNNING:
            return answer("running", False, step, f"{step.title} is running "
                          f"(attempt {step.attempt}).")
        if step.status == StepStatus.RETRYING:
            return answer("running", False, step,
                          f"{step.title} retries at {step.retry_after:%Y-%m-%d %H:%M:%S}.")
    for step in steps.values():
        if step.status == StepStatus.BLOCKED:
            return answer("blocked", True, step, f"{step.title} is blocked: "
                          f"{step.last_summary or 'no reason given'}.")
    ready = ready_steps(run, steps)
    if ready:
        return answer("ready", True, ready[0], f"{ready[0].title} is ready to start.")
    return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")


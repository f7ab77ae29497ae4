"""Work steps: started by a worker or reported by an agent, completed, failed, retried,
skipped; and the leases that fence a worker's attempt."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q

from workflows.engine import processes
from workflows.specs.values import duration
from workflows.timing import clock

from ..errors import IllegalTransition, InvalidInput, NotFound
from ..models import Checkpoint, CheckpointKind, RunStatus, Step, StepKind, StepStatus
from .commit import commit
from .compensations import under_way
from .moves import (
    REASON_LIMIT,
    begin_attempt,
    check_text,
    check_value,
    clear_lease,
    close_gate,
    fail_for_good,
    merge_state,
    open_gate,
    replace_state,
    require_not_policy,
    require_open,
    require_operator,
    require_requester_or_operator,
    set_holder,
)
from .rows import (
    RunState,
    actor_of,
    flush_all,
    load,
    lock_runs,
    locked,
    next_claimable_run,
    read_locked,
)
from .rules import at_capacity, claimable_at, hard_failure, may_report, may_start, retry_delay


def start_step(run, key: str, *, actor=None, owner: str = "", lease_seconds=None) -> Step:
    """Move a ready worker step to running, taking a lease when `lease_seconds` is given."""
    with locked(run, key=key) as state:
        return _start(state, state.step(key), actor, owner, lease_seconds)


def claim_step(step_id: int, *, owner: str, lease_seconds: float, holder=None) -> Step:
    """A worker starts a given step under a lease (see start_step). `holder` (a
    `processes.Holder`) is the consumer process, recorded so the sweeper can tell whether
    it still lives."""
    with locked(None, step_id=step_id) as state:
        step = state.find(step_id)
        if step is None:
            raise NotFound(f"Step {step_id} does not exist.")
        return _start(state, step, f"worker {owner}", owner, lease_seconds, holder)


def claim_next(*, owner: str, lease_seconds: float, holder=None) -> Step | None:
    """A worker claims the next step any run has for it: the first ready step of the
    claimable run of highest priority that has waited longest for a worker (a round robin
    among runs of one priority). None when no run has work for a worker now."""
    for _ in range(5):
        with transaction.atomic():
            run_id = next_claimable_run()
            if run_id is None:
                return None
            # None: another worker took the last of it (its claim time is put right).
            step = claim_in(run_id, Chain(owner, lease_seconds, holder))
            if step is not None:
                return step
    return None


def startable(state: RunState) -> Step | None:
    """The run's first ready worker step if a worker may start it now, else None."""
    now = clock.now()
    step = state.first_ready(now)
    if step is None or not may_start(state.run, step, now,
                                     held_back=state.hard_failure() is not None,
                                     running=state.running_count()):
        return None
    return step


def reschedule(run):
    """Put a run's claim time right from its rows (not a transition: no checkpoint);
    returns it."""
    with locked(run) as state:
        _reschedule(state)
        return state.run.claimable_at


def _reschedule(state: RunState) -> None:
    now = clock.now()
    frontier = state.frontier()
    state.run.claimable_at = claimable_at(
        state.run, frontier, state.first_ready(now), held_back=hard_failure(frontier) is not None,
        running=state.running_count(), now=now)


def _start(state: RunState, step: Step, actor, owner: str, lease_seconds,
           holder=None) -> Step:
    run, key = state.run, step.key
    require_open(run, f"start {key}")
    if step.kind == StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is an approval gate; it is decided, not started.")
    now = clock.now()
    running = state.running_count()
    if not may_start(run, step, now, held_back=state.hard_failure() is not None,
                     running=running):
        if step.status == StepStatus.RETRYING and step.retry_after and step.retry_after > now:
            raise IllegalTransition(f"{key} retries at {step.retry_after:%H:%M:%S}, not yet.")
        if step.status == StepStatus.PENDING and step.waiting_on:
            raise IllegalTransition(f"{key} is waiting on its dependencies.")
        if step.status in (StepStatus.PENDING, StepStatus.RETRYING):
            if state.hard_failure() is not None:
                raise IllegalTransition(f"Cannot start {key}: the failure of "
                                        f"{state.hard_failure().key} holds run {run.pk} back.")
            if at_capacity(run, running):
                raise IllegalTransition(f"Cannot start {key}: run {run.pk} already runs "
                                        f"{running} steps, its max_parallel.")
        raise IllegalTransition(f"Cannot start {key}: it is {step.status}.")
    begin_attempt(step, now)
    evidence = {"attempt": step.attempt}
    if lease_seconds:
        step.lease_owner = owner[:200]
        step.lease_token = uuid.uuid4().hex
        step.lease_expires_at = now + timedelta(seconds=lease_seconds)
        evidence["owner"] = owner
        run.served_at = now  # the round robin of claims
    if holder is not None:
        set_holder(step, holder)
        evidence["holder"] = holder.as_dict()
    commit(state, CheckpointKind.STEP_STARTED, actor=actor, step=step,
           summary=f"Attempt {step.attempt}" + (f" on {owner}" if owner else ""),
           evidence=evidence)
    return step


def _stale(state: RunState, step, actor, lease_token, what: str, reported=None) -> Checkpoint:
    """A result whose lease moved on is kept as evidence, never applied: what it said (its
    exit code, and a digest of its output, which is not kept) beside the lease it had."""
    evidence = {"token": lease_token, "current_token": step.lease_token}
    reported = reported if isinstance(reported, dict) else {}
    if "exit_code" in reported:
        evidence["exit_code"] = reported["exit_code"]
    if "stdout" in reported or "stderr" in reported:  # a command's report, even if silent
        output = "".join(str(reported.get(name) or "") for name in ("stdout", "stderr"))
        evidence["output_sha256"] = hashlib.sha256(output.encode()).hexdigest()
    return commit(
        state, CheckpointKind.STALE_RESULT, actor=actor, step=step,
        summary=f"Ignored a {what} result for {step.key}: its lease was lost "
                f"(step is {step.status}).",
        evidence=evidence,
    )


def _reported_step(state: RunState, key: str, actor, lease_token, verb: str, gate_verb: str,
                   reported=None):
    """(step, None) for a step a worker or agent may report on now, or (step, checkpoint)
    when the report carries a lease token that is no longer current (`reported`: the
    report's evidence, for the stale result's record)."""
    run = state.run
    step = state.step(key)
    if lease_token is not None and (
        step.lease_token != lease_token or step.status != StepStatus.RUNNING
    ):
        if lease_token and lease_token == step.finished_token:
            # This attempt's report, recorded already: the worker sent it again because its
            # connection dropped as the first one committed. Nothing to record twice.
            return step, (Checkpoint.objects.filter(run_id=run.pk, step_id=step.pk)
                          .order_by("-seq").first())
        outcome = {"complete": "completed", "fail": "failed"}[verb]
        return step, _stale(state, step, actor, lease_token, outcome, reported)
    require_open(run, f"{verb} {key}")
    if step.kind == StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is an approval gate; {gate_verb} it instead.")
    if step.status not in (StepStatus.RUNNING, StepStatus.BLOCKED):
        raise IllegalTransition(f"Cannot {verb} {key}: it is {step.status}.")
    return step, None


@dataclass(frozen=True)
class Chain:
    """A worker's offer to go on with the run's next ready step itself (see complete_step)."""

    owner: str
    lease_seconds: float
    holder: object = None


def complete_step(run, key: str, *, actor=None, summary: str = "", evidence=None,
                  state_patch=None, lease_token: str | None = None,
                  chain: Chain | None = None) -> Checkpoint:
    """Finish a running step successfully, merging its state patch into the run.

    With `chain`, the same transaction also claims the first step this completion made ready
    for that worker (its own checkpoint, `checkpoint.next_step`), saving a queue hop and a
    claim; every other newly ready step still gets its doorbell.
    """
    with locked(run, key=key, fairness=chain is not None) as state:
        checkpoint, recorded = complete_reported(state, key, actor=actor, summary=summary,
                                                 evidence=evidence, state_patch=state_patch,
                                                 lease_token=lease_token)
        if recorded:
            checkpoint.next_step = _chain(state, checkpoint, chain) if chain else None
        return checkpoint


def complete_reported(state: RunState, key: str, *, actor, summary: str = "", evidence=None,
                      state_patch=None,
                      lease_token: str | None = None) -> tuple[Checkpoint, bool]:
    """complete_step on a locked run's rows; also says whether the step completed now
    (False: the report was stale, or repeated and recorded already)."""
    step, stale = _reported_step(state, key, actor, lease_token, "complete", "approve",
                                 evidence)
    if stale:
        return stale, False
    patch = merge_state(state.run, state_patch)
    step.status = StepStatus.COMPLETED
    step.finished_at = clock.now()
    step.last_summary = summary
    step.last_evidence = evidence or {}
    step.last_state_patch = patch
    step.finished_token = lease_token or ""
    clear_lease(step)
    return commit(state, CheckpointKind.STEP_COMPLETED, actor=actor, step=step,
                  summary=summary or f"{step.title} completed",
                  evidence=evidence, state_patch=patch), True


def _chain(state: RunState, checkpoint: Checkpoint, chain: Chain) -> Step | None:
    """The step the worker that offered to go on starts next, in the completion's
    transaction: the run's next ready step, or, when another run has waited longer for a
    worker, that run's (no run starves another, and a busy worker still commits once per
    step). None when there is none to take now."""
    if state.fairer_waiting:
        return _claim_elsewhere(state.run.pk, chain)
    step = startable(state)
    if step is None:
        return None
    return chain_start(state, step, checkpoint.announcement, chain)


def chain_start(state: RunState, step: Step, announcement, chain: Chain) -> Step:
    """Start a step the completion just announced, for the worker that completed it: the
    step's doorbell is not rung."""
    if step.pk in announcement.ring:
        announcement.ring.remove(step.pk)  # this worker runs it: no doorbell
    return _start(state, step, f"worker {chain.owner}", chain.owner, chain.lease_seconds,
                  chain.holder)


def _claim_elsewhere(held: int, chain: Chain) -> Step | None:
    """Claim for the chaining worker the step of the run that waited longest, besides the
    run it holds; a run another worker is claiming from is passed over rather than waited
    for (this transaction holds a run's lock already)."""
    run_id = next_claimable_run(besides=held, wait=False)
    if run_id is None:
        return None
    return claim_in(run_id, chain)


def claim_in(run_id: int, chain: Chain) -> Step | None:
    """In the caller's transaction, start the run's first ready step for the worker (see
    take_first)."""
    try:
        state = load(run_id)
    except NotFound:
        return None
    step = take_first(state, chain)
    state.flush()
    return step


def take_first(state: RunState, chain: Chain) -> Step | None:
    """Start the run's first ready step for the worker; None (and the run's claim time put
    right) when it has none a worker may start now."""
    step = startable(state)
    if step is None:
        _reschedule(state)  # its claim time was stale
        return None
    return _start(state, step, f"worker {chain.owner}", chain.owner, chain.lease_seconds,
                  chain.holder)


def fail_step(run, key: str, *, actor=None, summary: str = "", evidence=None,
              lease_token: str | None = None, retryable: bool = True) -> Checkpoint:
    """Fail a running step: it retries while attempts remain, else it fails."""
    with locked(run, key=key) as state:
        return fail_reported(state, key, actor=actor, summary=summary, evidence=evidence,
                             lease_token=lease_token, retryable=retryable)


def fail_reported(state: RunState, key: str, *, actor, summary: str = "", evidence=None,
                  lease_token: str | None = None, retryable: bool = True) -> Checkpoint:
    """fail_step on a locked run's rows."""
    step, stale = _reported_step(state, key, actor, lease_token, "fail", "reject", evidence)
    if stale:
        return stale
    step.finished_token = lease_token or ""
    return _fail(state, step, actor, summary, evidence, retryable)


def _fail(state: RunState, step, actor, summary, evidence, retryable=True) -> Checkpoint:
    run = state.run
    now = clock.now()
    clear_lease(step)
    step.last_summary = summary
    step.last_evidence = evidence or {}
    retries_used = step.attempt - step.attempt_base - 1
    if retryable and retries_used < step.max_retries:
        delay = retry_delay(step, retries_used + 1)
        step.status = StepStatus.RETRYING
        step.retry_after = now + timedelta(seconds=delay)
        step.rung_at = None  # the retry needs a doorbell of its own
        return commit(state, CheckpointKind.STEP_RETRYING, actor=actor, step=step,
                      summary=f"{summary or 'Failed'}; retry {retries_used + 1} of "
                               f"{step.max_retries} in {delay:.1f}s",
                      evidence={**(evidence or {}), "retry_after": step.retry_after.isoformat()})
    fail_for_good(run, step, now, summary)
    return commit(state, CheckpointKind.STEP_FAILED, actor=actor, step=step,
                  summary=summary or f"{step.title} failed", evidence=evidence)


def retry_step(run, key: str, *, actor=None) -> Checkpoint:
    """Try a failed step again; a gate asks for fresh approvals."""
    require_operator(actor, f"retry {key}")
    with locked(run, key=key) as state:
        run = state.run
        step = state.step(key)
        if run.status == RunStatus.CANCELLED:
            raise IllegalTransition(f"Cannot retry {key}: run {run.pk} is cancelled.")
        if step.status != StepStatus.FAILED:
            raise IllegalTransition(f"Cannot retry {key}: it is {step.status}; "
                                    "only a failed step can be retried.")
        redone = _reopen_failed_run(state, key, "retry")
        step = state.step(key)
        step.finished_at = None
        step.retry_after = None
        if step.kind == StepKind.APPROVAL:
            step.attempt += 1  # a fresh attempt: its rules are matched anew
            step.escalated_at = None
            open_gate(step, clock.now())
        else:
            step.status = StepStatus.PENDING
            step.attempt_base = step.attempt  # a fresh window of automatic retries
            step.rung_at = None
        return commit(state, CheckpointKind.STEP_RETRIED, actor=actor, step=step,
                      summary=f"Retry of {step.title} requested" + _rerun_note(redone),
                      evidence={"rerun_compensated": redone} if redone else None)


def _reopen_failed_run(state: RunState, key: str, verb: str) -> list[str]:
    """Before a retry or a skip moves a failed run on: refuse while its compensation is
    under way, and reopen what compensation undid (it is not done any more: it runs
    again). Returns the keys reopened."""
    run = state.run
    if under_way(run):
        raise IllegalTransition(f"Cannot {verb} {key}: the compensation of run {run.pk} is "
                                f"still under way; {verb} once it has finished.")
    undone = list(Step.objects.filter(run=run, status=StepStatus.COMPENSATED).order_by("index"))
    for step in undone:
        step = state.find(step.pk) or state.add(step)
        # Compensated was not settled either: the dependents' counts stay as they are.
        step.status = StepStatus.PENDING
        step.compensated_at = step.rung_at = step.finished_at = None
        step.attempt_base = step.attempt
    return [step.key for step in undone]


def _rerun_note(redone: list[str]) -> str:
    return f"; {', '.join(redone)} run again (compensated)" if redone else ""


def skip_step(run, key: str, *, actor=None, reason: str = "") -> Checkpoint:
    """Skip a work step; its dependants may go on. A running one is skipped at once: its
    worker's next heartbeat finds the step skipped and stops the command's process tree,
    and the attempt's late result is kept as `stale result` evidence.

    A gate is never skipped, whoever asks: only its approvers pass it, under its quorum.
    """
    reason = check_text(reason, "The reason", REASON_LIMIT)
    with locked(run, key=key) as state:
        run = state.run
        step = state.step(key)
        if step.kind == StepKind.APPROVAL:
            raise IllegalTransition(f"{key} is an approval gate: it is decided by the "
                                    f"{step.approval_group} group, never skipped.")
        require_operator(actor, f"skip {key}")
        if not (reason or "").strip():
            raise InvalidInput(f"A reason is required to skip {key}.")
        if step.status in (StepStatus.COMPLETED, StepStatus.SKIPPED, StepStatus.CANCELLED,
                           StepStatus.COMPENSATED):
            raise IllegalTransition(f"Cannot skip {key}: it is {step.status}.")
        stopped = step.status == StepStatus.RUNNING and bool(step.lease_token)
        redone = []
        if run.status == RunStatus.FAILED and step.status == StepStatus.FAILED:
            # Skipping the failure that holds the run moves it on, as a retry would.
            redone = _reopen_failed_run(state, key, "skip")
        else:
            require_open(run, f"skip {key}")
        evidence = {"rerun_compensated": redone} if redone else {}
        if stopped:
            evidence["stopped_attempt"] = {"attempt": step.attempt, "owner": step.lease_owner}
        if step.status == StepStatus.RUNNING and step.child_run_id:
            evidence["children"] = [step.child_run_id]  # cancelled from the outbox
        token = step.lease_token
        step.status = StepStatus.SKIPPED
        close_gate(step)
        step.finished_at = clock.now()
        step.last_summary = reason
        clear_lease(step)
        if stopped:
            # Kept, as a cancel keeps it: the worker's heartbeat sees the step skipped (not
            # running under its token) and stops the command; its late report is stale.
            step.lease_token = token
        return commit(state, CheckpointKind.STEP_SKIPPED, actor=actor, step=step,
                      summary=reason + _rerun_note(redone), evidence=evidence or None)


AGENT_STATUSES = (StepStatus.RUNNING, StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.BLOCKED)


STATE_MODES = ("merge", "replace")


def record_transition(run, key: str, *, actor=None, step_status: str | None = None,
                      summary: str = "", evidence=None, state_patch=None,
                      next_action: str | None = None, label: str = "",
                      blocker_reason: str = "", shared_state_mode: str = "merge") -> Checkpoint:
    """An agent reports progress on a wait step, one it performs itself. Worker steps and
    gates are refused (409) whoever asks: their workers and approvers move them.

    The caller may also say what the run does next (`next_action`; "" clears it), name this
    point of the run (`label`, on the checkpoint), say why it is blocked (`blocker_reason`,
    with step_status "blocked"), and replace the shared state rather than merge into it
    (`shared_state_mode` "replace": the patch becomes the whole state)."""
    if step_status not in (None, "", *AGENT_STATUSES):
        raise InvalidInput(f"step_status must be one of {', '.join(map(str, AGENT_STATUSES))}, "
                           f"got {step_status!r}.")
    if shared_state_mode not in STATE_MODES:
        raise InvalidInput(f"shared_state_mode must be merge or replace, got "
                           f"{shared_state_mode!r}.")
    if shared_state_mode == "replace" and state_patch is None:
        raise InvalidInput("shared_state_mode replace needs state_patch: the whole new state.")
    label = check_text(label, "label", 100)
    blocker_reason = check_text(blocker_reason, "blocker_reason", REASON_LIMIT)
    if blocker_reason and step_status != StepStatus.BLOCKED:
        raise InvalidInput("blocker_reason goes with step_status blocked.")
    if next_action is not None:
        next_action = check_text(next_action, "next_action", 500)
    if evidence is not None and not isinstance(evidence, dict):
        raise InvalidInput("evidence must be a JSON object.")
    check_value(evidence, "evidence")
    with locked(run, key=key) as state:
        run = state.run
        require_requester_or_operator(actor, run, "report on")
        step = state.step(key)
        require_open(run, f"report on {key}")
        if step.kind == StepKind.APPROVAL:
            raise IllegalTransition(f"{key} is an approval gate; approvers decide it.")
        if step.kind != StepKind.WAIT:
            raise IllegalTransition(f"{key} is a worker step: only its worker reports it "
                                    "(an operator may skip it).")
        now = clock.now()
        ready = may_report(run, step, now, held_back=state.hard_failure() is not None)
        current = step.status
        if step_status in (None, ""):
            if current in (StepStatus.COMPLETED, StepStatus.SKIPPED, StepStatus.CANCELLED):
                raise IllegalTransition(f"Cannot report on {key}: it is {current}.")
        elif current == StepStatus.RUNNING and step.lease_token:
            raise IllegalTransition(f"{key} is being run by a worker ({step.lease_owner}).")
        elif step_status == StepStatus.RUNNING:
            if not (ready or current == StepStatus.BLOCKED):
                raise IllegalTransition(f"Cannot start {key}: it is {current}"
                                        + (" and waiting on dependencies."
                                           if current == StepStatus.PENDING else "."))
            if current != StepStatus.BLOCKED:
                begin_attempt(step, now)
            step.status = StepStatus.RUNNING
        else:
            if not (ready or current in (StepStatus.RUNNING, StepStatus.BLOCKED)):
                raise IllegalTransition(f"Cannot mark {key} {step_status}: it is {current}"
                                        + (" and waiting on dependencies."
                                           if current == StepStatus.PENDING else "."))
            if ready:
                begin_attempt(step, now)
            step.status = step_status
            if step_status == StepStatus.COMPLETED:
                step.finished_at = now
            elif step_status == StepStatus.FAILED:
                fail_for_good(run, step, now, summary)
            if step_status in (StepStatus.COMPLETED, StepStatus.FAILED):
                close_gate(step)  # a wait step's timeout no longer applies
        require_not_policy(run, state_patch, replace=shared_state_mode == "replace")
        if shared_state_mode == "replace":
            patch = replace_state(run, state_patch)
        else:
            patch = merge_state(run, state_patch)
        if next_action is not None:
            run.caller_next_action = next_action
        if blocker_reason:
            run.blocker_reason = blocker_reason
        step.last_summary = summary or step.last_summary
        step.reported_by = actor_of(actor)[1][:200]
        if evidence:
            step.last_evidence = evidence
        if patch:
            step.last_state_patch = patch
        if shared_state_mode == "replace":
            evidence = {**(evidence or {}), "shared_state_replaced": True}
        # The checkpoint keeps the attempt it reports on and the next action said with it;
        # unlabelled, it is labelled with the step's status (the seed's default).
        evidence = {**(evidence or {}), "attempt": step.attempt,
                    **({"next_action": next_action} if next_action is not None else {})}
        return commit(state, CheckpointKind.TRANSITION, actor=actor, step=step,
                      summary=summary or f"{step.title}: {step.status}",
                      evidence=evidence, state_patch=patch, label=label or step.status)


def record_note(run, *, actor=None, summary: str = "", evidence=None, state_patch=None,
                label: str = "", next_action: str | None = None,
                shared_state_mode: str = "merge") -> Checkpoint:
    """A checkpoint on the run itself, naming no step: a note (summary, label, evidence)
    and, if given, the shared state's patch and the run's next action. No status moves."""
    if shared_state_mode not in STATE_MODES:
        raise InvalidInput(f"shared_state_mode must be merge or replace, got "
                           f"{shared_state_mode!r}.")
    if shared_state_mode == "replace" and state_patch is None:
        raise InvalidInput("shared_state_mode replace needs state_patch: the whole new state.")
    summary = check_text(summary, "summary", 10000)
    label = check_text(label, "label", 100)
    if next_action is not None:
        next_action = check_text(next_action, "next_action", 500)
    if evidence is not None and not isinstance(evidence, dict):
        raise InvalidInput("evidence must be a JSON object.")
    check_value(evidence, "evidence")
    if not (summary or label or evidence or state_patch or next_action is not None):
        raise InvalidInput("A note on the run needs a summary, a label, evidence, a state "
                           "patch or a next action (or name the step it is about).")
    with locked(run) as state:
        run = state.run
        require_requester_or_operator(actor, run, "note on")
        require_open(run, "note on it")
        require_not_policy(run, state_patch, replace=shared_state_mode == "replace")
        patch = (replace_state(run, state_patch) if shared_state_mode == "replace"
                 else merge_state(run, state_patch))
        if next_action is not None:
            run.caller_next_action = next_action
        if shared_state_mode == "replace":
            evidence = {**(evidence or {}), "shared_state_replaced": True}
        if next_action is not None:
            evidence = {**(evidence or {}), "next_action": next_action}
        return commit(state, CheckpointKind.RUN_NOTE, actor=actor,
                      summary=summary or label or "Note on the run", evidence=evidence,
                      state_patch=patch, label=label or run.status)


def renew_leases(leases: dict[int, str], seconds: float) -> set[int]:
    """Extend the live leases among {step id: token}; returns the ids still held. One
    round trip for every step a consumer process runs."""
    if not leases:
        return set()
    held = Q()
    for step_id, token in leases.items():
        held |= Q(pk=step_id, lease_token=token)
    steps = Step.objects.filter(held, status=StepStatus.RUNNING)
    renewed = set(steps.values_list("pk", flat=True))
    if renewed:
        Step.objects.filter(pk__in=renewed).update(
            lease_expires_at=clock.now() + timedelta(seconds=seconds), overdue_noted_at=None)
    return renewed


def mark_began(step_id: int, token: str) -> bool:
    """A step claimed behind others in a batch begins now (`began_at`, written before its
    work starts). False when the lease is no longer this token's (taken back, given back,
    cancelled): then it must not begin."""
    return bool(Step.objects.filter(pk=step_id, lease_token=token, status=StepStatus.RUNNING)
                .update(began_at=clock.now()))


def record_child(step_id: int, token: str, pid: int, pgid: int) -> bool:
    """Note the command a running attempt spawned (shown on the run page while it runs)."""
    return bool(Step.objects.filter(pk=step_id, lease_token=token, status=StepStatus.RUNNING)
                .update(child_pid=pid, child_pgid=pgid))


def _overdue(step, now) -> bool:
    return (step is not None and step.status == StepStatus.RUNNING
            and step.lease_expires_at is not None and step.lease_expires_at <= now)


def expire_lease(step_id: int, *, actor=None, why: str = "") -> Checkpoint | None:
    """Reclaim a running step whose lease ran out and whose holder is gone (the caller has
    checked): it retries or fails as its policy says."""
    require_operator(actor, "recover runs")
    with locked(None, step_id=step_id) as state:
        return _expire(state, state.find(step_id), actor, why)


def expire_leases(leases: dict[int, list[int]], *, actor=None) -> list[Checkpoint]:
    """expire_lease for many steps, {run id: step ids}, in one transaction (one checkpoint
    each): the sweeper's batch. Its runs are locked in one statement, in order of id, so two
    sweepers cannot deadlock and a worker (which holds runs in that order too) waits at
    most a batch; they are read in one statement and written in one."""
    require_operator(actor, "recover runs")
    done = []
    with transaction.atomic():
        states = read_locked(lock_runs(list(leases)))
        now = clock.database_now()  # once for the batch: its statements stay constant
        for state in states:
            expired = (_expire(state, state.find(step_id), actor, now=now)
                       for step_id in leases[state.run.pk])
            done += [checkpoint for checkpoint in expired if checkpoint is not None]
        flush_all(states)
    return done


def _expire(state: RunState, step, actor, why: str = "", now=None) -> Checkpoint | None:
    # The database's word on the lease, not this process's clock.
    if not _overdue(step, now or clock.database_now()):
        return None  # renewed, finished or already swept
    owner = step.lease_owner
    evidence = {"lease_owner": owner, "expired_at": step.lease_expires_at.isoformat(),
                "holder": {"host": step.holder_host, "pid": step.holder_pid},
                "child": {"pid": step.child_pid, "pgid": step.child_pgid}}
    if not why and not processes.local(step.holder_boot_id, step.holder_pidns):
        why = (f"Lease of {owner or 'its worker'} expired and was not renewed within the kill "
               f"grace; its worker (on {step.holder_host or 'another machine'}, another "
               "machine or container) could not be checked and has stopped its command")
    return _fail(state, step, actor or (f"sweeper ({owner})" if owner else "sweeper"),
                 why or f"Lease of {owner or 'its worker'} expired; the worker is gone",
                 evidence)


NOT_STARTED = "Claimed in a batch but not started: given back, no attempt spent"


def release_unstarted(leases: dict[int, str], *, actor, why: str = "",
                      unless_began: bool = False) -> list[Checkpoint]:
    """Give back steps a worker claimed (in a batch) and never started, {step id: lease
    token}: each is ready again at once and no attempt is spent (its retry window moves on
    with it). A step whose lease is no longer that token (reclaimed, finished, cancelled)
    is left as it is; so is one whose record says it began, when `unless_began` (the
    sweeper's call: only the record speaks for a holder it cannot ask)."""
    done = []
    for step_id, token in leases.items():
        with locked(None, step_id=step_id) as state:
            step = state.find(step_id)
            if (step is None or step.status != StepStatus.RUNNING or not token
                    or step.lease_token != token
                    or (unless_began and step.began_at is not None)):
                continue
            clear_lease(step)
            step.status = StepStatus.RETRYING
            step.retry_after = None
            step.rung_at = None  # it needs a doorbell again
            step.attempt_base += 1  # the attempt it was claimed for never ran
            done.append(commit(state, CheckpointKind.STEP_RELEASED, actor=actor, step=step,
                               summary=why or NOT_STARTED))
    return done


def note_lease_overdue(step_id: int) -> Checkpoint | None:
    """The lease ran out but its holder still lives (slow, frozen or cut off from the
    database): say so once on the timeline, and wait."""
    with locked(None, step_id=step_id) as state:
        step = state.find(step_id)
        if not _overdue(step, clock.database_now()) or step.overdue_noted_at is not None:
            return None
        step.overdue_noted_at = clock.now()
        return commit(state, CheckpointKind.LEASE_OVERDUE, actor="sweeper", step=step,
                      summary=f"Lease overdue, holder alive ({step.holder_host} pid "
                              f"{step.holder_pid}); waiting for it",
                      evidence={"expired_at": step.lease_expires_at.isoformat()})


def note_sweep_failure(run_id: int, step_id: int | None, summary: str) -> Checkpoint:
    """Put on a run's timeline that the sweeper could not handle one of its rows."""
    with locked(run_id, step_id=step_id) as state:
        step = state.find(step_id) if step_id else None
        return commit(state, CheckpointKind.SWEEP_FAILED, actor="sweeper", step=step,
                      summary=summary[:2000])


def expire_wait(step_id: int) -> Checkpoint | None:
    """A wait step whose report did not come in time fails or is skipped, as its spec says."""
    with locked(None, step_id=step_id) as state:
        run, step = state.run, state.find(step_id)
        now = clock.database_now()
        if (step is None or step.kind != StepKind.WAIT or run.is_terminal
                or step.status not in (StepStatus.PENDING, StepStatus.RUNNING,
                                       StepStatus.BLOCKED)
                or step.deadline_at is None or step.deadline_at > now):
            return None
        waited = duration(step.config.get("timeout_seconds"))
        close_gate(step)
        summary = f"No report within {waited}"
        if step.config.get("on_timeout") == "skip":
            step.status, step.finished_at, step.last_summary = StepStatus.SKIPPED, now, summary
        else:
            fail_for_good(run, step, now, summary, f"no report within {waited}")
        return commit(state, CheckpointKind.WAIT_TIMED_OUT, actor="deadline", step=step,
                      summary=f"{summary}: {step.status}")

"""The commit: every transition ends here, in the transaction that holds the run's lock.

It settles the acted step's dependents, opens gates whose dependencies settled, derives the
run's status, next action and claim time from the frontier, appends exactly one checkpoint,
and announces what follows (doorbells, retries, compensation, notifications) for after the
transaction commits. It works on the rows the transaction loaded (`rows.RunState`); they
are written when the transaction ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from workflows.engine import policy
from workflows.engine.moves import (
    close_gate,
    decided_keys,
    evidence_digest,
    open_gate,
    start_waiting,
)
from workflows.engine.rows import RunState, actor_of
from workflows.engine.rules import (
    claimable_at,
    condition_holds,
    hard_failure,
    next_action,
    run_status,
    settled,
)
from workflows.engine.signals import transition_committed
from workflows.models import (
    TERMINAL_RUN_STATUSES,
    Approval,
    Checkpoint,
    CheckpointKind,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from workflows.timing import clock


@dataclass
class Announcement:
    """What a committed transition asks the rest of the system to do."""

    run_id: int
    checkpoint: Checkpoint
    run_status: str
    previous_status: str
    priority: int = 1  # the run's priority rank, for its doorbells
    compensations: int = 0  # planned by this transition (the run just failed)
    ring: list[int] = field(default_factory=list)  # newly ready steps: doorbells to ring
    retry: list[tuple[int, object]] = field(default_factory=list)  # (step id, eta)
    outbox: list[int] = field(default_factory=list)  # messages written for it, to ring
    parent_step_id: int | None = None  # a child run's: the parent step waiting for it
    gates: list[int] = field(default_factory=list)  # gates acted on, opened or closed
    # of those, the ones whose rules' (group, person id) the transition read already
    audiences: dict[int, list[tuple[str, int | None]]] = field(default_factory=dict)

    @property
    def checkpoint_id(self) -> int:
        return self.checkpoint.pk

    @property
    def run_failed(self) -> bool:
        return self.run_status == RunStatus.FAILED and self.previous_status != RunStatus.FAILED

    @property
    def run_ended(self) -> bool:
        """Did this transition close the run (completed, failed or cancelled)?"""
        return (self.run_status in TERMINAL_RUN_STATUSES
                and self.previous_status not in TERMINAL_RUN_STATUSES)


def commit(state: RunState, kind: str, *, actor, step: Step | None = None, summary: str = "",
           evidence: dict | None = None, state_patch: dict | None = None,
           label: str = "") -> Checkpoint:
    """Settle what follows from the acted step and append the one checkpoint."""
    run = state.run
    now = clock.now()
    if step is not None:
        _tell_dependents(state, step)
    skipped = _skip_false_conditions(state, now)
    frontier = state.frontier()
    failed = hard_failure(frontier)
    opened = _open_gates(run, frontier, failed, now)
    previous_status = run.status
    _settle_run(state, frontier, step, now, previous_status, failed)
    run.checkpoint_seq += 1
    gates = [gate.key for gate in opened if gate.kind == StepKind.APPROVAL]
    stale, changed = _stale_approvals(state, frontier, failed, now)
    if changed:  # shown anew wherever they are shown (chat's messages re-rendered)
        evidence = {**(evidence or {}), "gates_changed": changed}
    if stale:
        # The approvers are told as when a gate opens (mail, chat, inbox).
        evidence = {**(evidence or {}), "approvals_stale": stale}
        gates += [key for key in stale if key not in gates]
        summary = "; ".join([summary, *(
            f"approvals of {key} by {', '.join(seen['stale'])} no longer count: "
            f"{', '.join(seen['changed']) or 'the evidence'} changed"
            for key, seen in stale.items())]).lstrip("; ")
    if gates:
        evidence = {**(evidence or {}), "gates_opened": gates}
    if children := _children_to_cancel(run, frontier, failed, step):
        evidence = {**(evidence or {}), "children": children}
    if label:
        run.last_label = label
    user, name = actor_of(actor)
    checkpoint = state.append(
        kind=kind, step=step, run_status=run.status, step_status=step.status if step else "",
        actor=user, actor_name=name, summary=summary[:10000], evidence=evidence or {},
        state_patch=state_patch or {}, at=now, label=label)
    _announce(state, checkpoint, frontier, failed, previous_status, now, step)
    for skip, why in skipped:  # after the transition that settled their dependencies
        run.checkpoint_seq += 1
        state.append(kind=CheckpointKind.STEP_SKIPPED, step=skip, run_status=run.status,
                     step_status=skip.status, actor=None, actor_name="condition", summary=why,
                     evidence={"when": skip.config["when"]}, state_patch={}, at=now)
    return checkpoint


def _stale_approvals(state: RunState, frontier, failed, now) -> tuple[dict, list[str]]:
    """Gates that were waiting when this transition changed what their approvers saw (the
    run's shared state): the approvals already made no longer count. The gate starts a new
    attempt (its deadline kept), so each approver decides again on what is there now.
    ({gate key: {"stale": who had decided, "changed": the state keys that changed}}, the
    keys of the gates nobody had decided whose evidence changed: a decision on what was
    shown before is refused, and they are shown anew)."""
    run = state.run
    before = state.run_loaded.get("shared_state") or {}
    after = run.shared_state or {}
    if before == after or failed or run.is_terminal:
        return {}, []
    theirs = decided_keys(run)  # what approvers wrote is not evidence (evidence_digest)
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and k not in theirs)
    found, refreshed = {}, []
    for gate in frontier:
        if (gate.kind != StepKind.APPROVAL or gate.status != StepStatus.WAITING_APPROVAL
                or gate.as_loaded.get("status") != StepStatus.WAITING_APPROVAL):
            continue
        digest = evidence_digest(gate)
        if gate.evidence_digest == digest:
            continue
        decided = list(Approval.objects.filter(step_id=gate.pk, attempt=gate.attempt)
                       .order_by("at", "pk").values_list("user__username", flat=True))
        if decided and gate.evidence_digest:
            deadline = gate.deadline_at
            gate.attempt += 1
            open_gate(gate, now)
            gate.deadline_at = deadline
            # What the card and the API say of this attempt: why it began.
            gate.last_summary = (
                f"Approvals by {', '.join(decided)} went stale: "
                f"{', '.join(changed) or 'the evidence'} changed after they decided "
                f"(attempt {gate.attempt - 1}).")[:500]
            found[gate.key] = {"stale": decided, "changed": changed}
        else:  # nobody has decided on the old evidence (or the gate predates digests)
            gate.evidence_digest = digest
            refreshed.append(gate.key)
    return found, refreshed


def _children_to_cancel(run, frontier, failed, step) -> list[int]:
    """The child runs to cancel because this transition's step failed the run while other
    steps wait for their children (unless a step's `on_parent_failure` is "continue"): the
    outbox cancels them, and the run fails once they have ended."""
    if failed is None or step is None or step.pk != failed.pk or run.is_terminal:
        return []
    return [s.child_run_id for s in frontier
            if s.status == StepStatus.RUNNING and s.child_run_id
            and (s.config.get("run") or {}).get("on_parent_failure") != "continue"]


def _tell_dependents(state: RunState, step: Step) -> None:
    """Keep the dependents' counts of unsettled dependencies as a step settles or reopens."""
    now_settled = settled(step)
    if now_settled == step.settled_when_loaded or not step.dependents:
        step.settled_when_loaded = now_settled
        return
    for dependent in state.ensure_dependents(step):
        dependent.waiting_on += -1 if now_settled else 1
    step.settled_when_loaded = now_settled


def _skip_false_conditions(state: RunState, now) -> list[tuple[Step, str]]:
    """Steps whose dependencies have just settled and whose `when` is false are skipped
    (which may settle, and so test, the steps after them). Returns (step, why) for each."""
    run = state.run
    if run.is_terminal or state.hard_failure() is not None:
        return []  # tested when the run moves on again
    skipped = []
    while True:
        due = [s for s in state.frontier() if s.status == StepStatus.PENDING
               and s.waiting_on == 0 and s.config.get("when") and _untested(s)]
        false = []
        for step in due:
            holds, why = condition_holds(step.config["when"], run.shared_state or {},
                                         run.params or {})
            if not holds:
                false.append((step, why))
            else:
                step.condition_held = True  # not again in this transaction
        if not false:
            return skipped
        for step, why in false:
            step.status, step.finished_at = StepStatus.SKIPPED, now
            step.last_summary = f"Skipped: {why}"
            close_gate(step)
            _tell_dependents(state, step)
            skipped.append((step, step.last_summary))


def _untested(step: Step) -> bool:
    """Has the step's condition not been tested since its dependencies settled? A worker
    step is announced, a gate opened and a wait step starts waiting right after the test."""
    if getattr(step, "condition_held", False):
        return False
    if step.kind == StepKind.RUN:
        return step.rung_at is None
    if step.kind == StepKind.WAIT:
        return step.waiting_since is None
    return True  # a pending gate whose dependencies have settled opens in this commit


def _open_gates(run, frontier, failed, now) -> list:
    """Gates whose dependencies have settled start waiting on their approvers; wait steps
    start waiting for their report (and their timeout)."""
    if run.status == RunStatus.CANCELLED or failed:
        return []
    opened = [gate for gate in frontier
              if gate.kind == StepKind.APPROVAL and gate.status == StepStatus.PENDING]
    for gate in opened:
        open_gate(gate, now)
    for step in frontier:
        if (step.kind == StepKind.WAIT and step.status == StepStatus.PENDING
                and step.waiting_on == 0 and step.waiting_since is None):
            start_waiting(step, now)
            opened.append(step)
    return opened


def _settle_run(state: RunState, frontier, step: Step | None, now, previous_status: str,
                failed) -> None:
    """Derive the run's status, times, next action and claim time. A run that fails here
    owes the compensations of its completed steps, and its open gates close."""
    run = state.run
    busy = any(s.status != StepStatus.PENDING for s in frontier)
    first = state.first_ready(now)
    # The ready step to name: the first not yet announced, else (ready steps already
    # announced are not in the frontier) the first one at all, when nothing else is open.
    ready = next((s for s in frontier
                  if s.kind == StepKind.RUN and s.status == StepStatus.PENDING), None)
    if ready is None and not busy:
        ready = first
    unsettled = busy or ready is not None or state.exists_unsettled()
    moved = run.started_at is not None or (step is not None and (
        step.attempt > 0 or step.status == StepStatus.SKIPPED))
    run.status = run_status(run, frontier, unsettled=unsettled, moved=moved)
    if run.status == RunStatus.FAILED:
        # A failed run waits on nobody: its open gates go back to pending until a retry.
        for gate in frontier:
            if gate.status == StepStatus.WAITING_APPROVAL:
                gate.status = StepStatus.PENDING
                gate.waiting_since = None
                close_gate(gate)
                policy.close_rules(gate)
    # A run that just failed owes the compensations of its completed steps: planned as its
    # rows are written (rows.flush_all), for every run written with it at once.
    state.owes_compensations = (run.status == RunStatus.FAILED
                                and previous_status != RunStatus.FAILED)
    if run.is_terminal:
        run.finished_at = run.finished_at or now
        run.caller_next_action = ""  # nothing is next for an ended run
    else:
        run.finished_at = None
        run.error = ""
    if run.status != RunStatus.BLOCKED:
        run.blocker_reason = ""
    if run.started_at is None and run.status != RunStatus.OPEN:
        run.started_at = now
    run.current_step, run.next_action = next_action(frontier, ready)
    run.claimable_at = claimable_at(run, frontier, first, held_back=failed is not None,
                                    running=state.running_count(), now=now)


def _announce(state: RunState, checkpoint: Checkpoint, frontier, failed, previous_status: str,
              now, acted: Step | None = None) -> None:
    """Mark newly ready steps announced (their run is claimable; one doorbell each) and
    announce the transition once it commits. If the process dies before the doorbells go
    out, the sweeper rings again."""
    run = state.run
    # A cancel sets the status before its commit: the status as loaded says what it was.
    loaded = state.run_loaded["status"]
    if previous_status in TERMINAL_RUN_STATUSES and loaded not in TERMINAL_RUN_STATUSES:
        previous_status = loaded
    announcement = Announcement(run.pk, checkpoint, run.status, previous_status,
                                run.priority_rank, parent_step_id=run.parent_step_id)
    if state.owes_compensations:
        state.owes_compensations = False
        state.owing = announcement  # told how many once they are planned
    if not (run.is_terminal or failed):
        announcement.ring = [s.pk for s in frontier if s.kind == StepKind.RUN
                             and s.status == StepStatus.PENDING and s.rung_at is None]
    announcement.retry = [(s.pk, s.retry_after) for s in frontier
                          if s.status == StepStatus.RETRYING and s.rung_at is None
                          and s.retry_after]
    for step in frontier:
        if step.pk in announcement.ring:
            step.rung_at = now
    # Whose inboxes may have changed: the gates decided, opened, retried or closed.
    announcement.gates = [
        s.pk for s in state.steps.values() if s.kind == StepKind.APPROVAL and (
            s is acted or s.status != s.as_loaded.get("status")
            or s.attempt != s.as_loaded.get("attempt"))]
    announcement.audiences = {pk: state.audiences[pk] for pk in announcement.gates
                              if pk in state.audiences}
    for step_id, eta in announcement.retry:
        state.find(step_id).rung_at = eta
    # Kept on the checkpoint until the commit: a chained claim takes its step out of `ring`.
    checkpoint.announcement = announcement
    state.announced.append(announcement)  # recorded (the outbox) as the state is written
    transaction.on_commit(
        lambda: transition_committed.send(sender=Run, announcement=announcement))

"""What a transition does to a step, and the checks every transition makes first."""

from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings

from workflows.audit import chain
from workflows.engine import policy
from workflows.engine.rows import actor_of
from workflows.engine.rules import MAX_DELAY_SECONDS
from workflows.errors import IllegalTransition, InvalidInput, NotPermitted
from workflows.models import Run, Step, StepStatus
from workflows.people import permissions
from workflows.specs.values import BadValue, check_json


def require_operator(actor, action: str) -> None:
    """A person must hold the operator permission; the system (None or a name) may act."""
    if permissions.is_person(actor) and not permissions.can_operate(actor):
        raise NotPermitted(f"{actor_of(actor)[1] or 'anonymous'} may not {action}: that needs "
                           "the operator permission.")


def require_requester_or_operator(actor, run: Run, action: str) -> None:
    """A person must have requested the run or hold the operator permission."""
    if permissions.is_person(actor) and not permissions.can_work_on(actor, run):
        raise NotPermitted(f"Only the run's requester or an operator may {action} run "
                           f"{run.pk}.")


def require_open(run: Run, action: str) -> None:
    if run.is_terminal:
        raise IllegalTransition(f"Cannot {action}: run {run.pk} is {run.status}.")


COMMENT_LIMIT = 5000  # a decision's comment
REASON_LIMIT = 500  # why a step was skipped or a run cancelled


def check_text(text: str, where: str, limit: int) -> str:
    """A comment or reason as a person typed it: at most `limit` characters, no NUL."""
    text = (text or "").strip()
    if len(text) > limit:
        raise InvalidInput(f"{where} is {len(text)} characters long; at most {limit}.")
    if "\x00" in text:
        raise InvalidInput(f"{where} has a NUL character; remove it and send again.")
    return text


def check_value(value, where: str) -> None:
    try:
        check_json(value, where)
    except BadValue as exc:
        raise InvalidInput(str(exc)) from None


def decided_keys(run: Run) -> set[str]:
    return set(run.decided_keys.split())


def merge_state(run: Run, patch, *, gate: str | None = None) -> dict:
    """Merge a step's state patch into the run's shared state; returns what was merged.
    A key a gate's approvers wrote is theirs: only that gate (`gate`) writes it again."""
    if patch in (None, {}):
        return {}
    if not isinstance(patch, dict):
        raise InvalidInput("state_patch must be a JSON object.")
    check_value(patch, "state_patch")
    if taken := sorted(decided_keys(run).intersection(patch) - {gate}):
        raise InvalidInput(_decided_refusal(taken))
    run.shared_state = {**(run.shared_state or {}), **patch}
    return patch


def replace_state(run: Run, state: dict) -> dict:
    """The whole shared state replaced (an agent's report), keeping what approvers chose."""
    check_value(state, "state_patch")
    if not isinstance(state, dict):
        raise InvalidInput("state_patch must be a JSON object.")
    shared = run.shared_state or {}
    if changed := sorted(key for key in decided_keys(run)
                         if key in shared and state.get(key, object()) != shared[key]):
        raise InvalidInput(_decided_refusal(changed))
    run.shared_state = dict(state)
    return run.shared_state


def reserve_key(run: Run, key: str) -> None:
    """Nobody's patch may change the state key `key` any more (but the gate of that key,
    which writes its approvers' values): a gate's approvers wrote it, or a gate's rules
    read it when the gate started waiting."""
    if key not in decided_keys(run):
        run.decided_keys = " ".join(sorted(decided_keys(run) | {key}))


def _decided_refusal(keys: list[str]) -> str:
    names = ", ".join(repr(key) for key in keys)
    return (f"state_patch may not change {names}: it is fixed by approval (what the "
            f"approvers of gate {names} chose, or what a gate's approval rules read when it "
            "started waiting), and kept as it was decided.")


def policy_keys(run: Run) -> set[str]:
    """The shared-state keys any gate of the run reads in its approval rules."""
    keys = set()
    for config in Step.objects.filter(run=run, kind="approval").values_list("config",
                                                                            flat=True):
        keys |= policy.state_read(config or {})
    return keys


def require_not_policy(run: Run, patch, *, replace: bool = False) -> None:
    """A person's or an agent's report may not write what a gate's approval rules read:
    those values come from the run's params and its worker steps, so the requester cannot
    choose who approves. InvalidInput names the keys."""
    if not isinstance(patch, dict) or not patch and not replace:
        return
    shared = run.shared_state or {}
    keys = policy_keys(run)
    touched = sorted(k for k in keys if (k in patch and patch[k] != shared.get(k, object()))
                     or (replace and k in shared and k not in patch))
    if touched:
        names = ", ".join(repr(key) for key in touched)
        raise InvalidInput(f"state_patch may not change {names}: an approval gate's rules "
                           "read it, so only the run's worker steps write it (a report "
                           "cannot choose who approves).")


def begin_attempt(step: Step, now) -> None:
    """A worker or an agent starts a new attempt of the step."""
    step.status = StepStatus.RUNNING
    step.attempt += 1
    step.started_at = step.began_at = now
    step.finished_at = None
    step.retry_after = None


def fail_for_good(run: Run, step: Step, now, summary: str, error: str = "") -> None:
    """The step has failed with no retry left; a failure that holds the run back is the
    run's error (`error`, else the summary)."""
    step.status = StepStatus.FAILED
    step.finished_at = now
    step.last_summary = summary
    if not step.continue_on_failure:
        run.error = f"{step.title}: {error or summary or 'failed'}"


def set_holder(row, holder) -> None:
    """Record the consumer process that holds a leased attempt (a `processes.Holder`)."""
    row.holder_host, row.holder_boot_id = holder.host[:200], holder.boot_id
    row.holder_pidns = holder.pidns[:40]
    row.holder_pid, row.holder_started = holder.pid, holder.started


def clear_lease(step: Step) -> None:
    """The attempt is over: its lease and holder go (the checkpoints keep them)."""
    step.lease_owner = ""
    step.lease_token = ""
    step.lease_expires_at = None
    step.holder_host = step.holder_boot_id = step.holder_pidns = ""
    step.holder_pid = step.holder_started = step.child_pid = step.child_pgid = None
    step.overdue_noted_at = None


def open_gate(gate: Step, now) -> None:
    """A gate starts waiting on its approval rules (`policy.open_rules`), with its deadline
    if the spec sets one."""
    approval = gate.config.get("approval", {})
    gate.status = StepStatus.WAITING_APPROVAL
    gate.attempt = max(gate.attempt, 1)
    gate.waiting_since = now
    timeout = approval.get("timeout_seconds")
    gate.deadline_at = now + timedelta(seconds=min(timeout, MAX_DELAY_SECONDS * 5)) if (
        timeout) else None
    gate.reminders_sent = 0
    gate.remind_at = next_reminder(gate, now)
    policy.open_rules(gate, now)
    gate.evidence_digest = evidence_digest(gate)
    # What the rules read is fixed now: no later report, patch or worker can change the
    # value a downstream step acts on after the approvers saw (and the rules judged) it.
    for key in policy.state_read(gate.config):
        reserve_key(gate.run, key)


def evidence_digest(gate: Step) -> str:
    """What the gate's approvers decide on, as a digest: the run's params and shared state
    (the values and outputs the card shows), its spec version and the gate's own spec
    (instructions, form, rules). Upstream steps are settled while a gate waits. The keys
    approvers wrote (a gate's form) are theirs, not evidence: they are left out."""
    run = gate.run
    theirs = decided_keys(run)
    state = {k: v for k, v in (run.shared_state or {}).items() if k not in theirs}
    return chain.digest({"params": run.params, "state": state, "spec": run.spec_id,
                         "gate": gate.config})


def evidence_changes(gate: Step, seen: str) -> list[str] | None:
    """What changed in what the gate's approvers decide on since the digest `seen` was
    taken: one line a value ("artifact: "v1" → "v2""), from the run's checkpoints (the
    shared state as it stood after each, the last whose digest was `seen`). None when no
    state the run passed through had that digest (the spec or the gate changed, or `seen`
    is not a digest of this gate)."""
    from ..models import Checkpoint

    run = gate.run
    theirs = decided_keys(run)

    def evidence(state: dict) -> dict:
        return {k: v for k, v in state.items() if k not in theirs}

    def digest(state: dict) -> str:
        return chain.digest({"params": run.params, "state": evidence(state),
                             "spec": run.spec_id, "gate": gate.config})

    state, then = {}, None
    for patch, notes in (Checkpoint.objects.filter(run_id=run.pk).order_by("seq")
                         .values_list("state_patch", "evidence")):
        state = chain.state_after(state, patch, notes)
        if digest(state) == seen:
            then = state
    if then is None:
        return None
    before, now = evidence(then), evidence(run.shared_state or {})

    def shown(key, values) -> str:
        if key not in values:
            return "(none)"
        text = json.dumps(values[key], ensure_ascii=False, default=str)
        return text if len(text) <= 200 else text[:199] + "…"

    return [f"{key}: {shown(key, before)} → {shown(key, now)}"
            for key in sorted(before.keys() | now.keys())
            if (key in before) != (key in now) or before.get(key) != now.get(key)]


def next_reminder(gate: Step, now):
    """When the gate's approvers are next reminded: `remind_after_seconds` after it starts
    waiting, then every `remind_every_seconds` (the TOLLGATE_REMIND_* settings for a gate
    that declares neither), never at or after its deadline; None when no reminder is due."""
    approval = gate.config.get("approval", {})
    if {"remind_after_seconds", "remind_every_seconds"} & set(approval):
        after = approval.get("remind_after_seconds", 0)
        every = approval.get("remind_every_seconds", 0)
    else:
        after = settings.TOLLGATE_REMIND_AFTER_SECONDS
        every = settings.TOLLGATE_REMIND_EVERY_SECONDS
    wait = (after or every) if gate.reminders_sent == 0 else every
    if not wait:
        return None
    at = now + timedelta(seconds=wait)
    return None if gate.deadline_at and at >= gate.deadline_at else at


def start_waiting(step: Step, now) -> None:
    """A wait step's dependencies have settled: it waits for its report, until its
    timeout if the spec sets one."""
    step.waiting_since = now
    timeout = step.config.get("timeout_seconds")
    step.deadline_at = now + timedelta(seconds=min(timeout, MAX_DELAY_SECONDS * 5)) if (
        timeout) else None


def close_gate(gate) -> None:
    gate.deadline_at = None
    gate.remind_at = None

"""Approval gates: decided only by their approvers, under their quorum and self-approval
rules (see `workflows.permissions`), or by their deadline."""

from __future__ import annotations

from workflows.specs.params import FieldErrors, coerce
from workflows.specs.values import duration

from .. import clock, permissions
from ..errors import IllegalTransition, InvalidInput, NotPermitted, WorkflowError
from ..models import (
    Approval,
    Channel,
    Checkpoint,
    CheckpointKind,
    Decision,
    Run,
    Step,
    StepKind,
    StepStatus,
)
from . import sql
from .commit import commit
from .moves import (
    COMMENT_LIMIT,
    check_text,
    close_gate,
    decided_keys,
    fail_for_good,
    merge_state,
    next_reminder,
    require_open,
    reserve_key,
)
from .rows import RunState, locked

APPROVAL = sql.Table(Approval)
APPROVAL_COLUMNS = ("step_id", "attempt", "user_id", "decision", "comment", "values",
                    "group", "waited_seconds", "at", "channel", "chat_identity")


def _check_approver(run: Run, step: Step, user) -> None:
    groups = set(user.groups.values_list("name", flat=True)) if permissions.is_person(
        user) and user.is_authenticated else set()
    refusal = permissions.decide_refusal(user, run, step, groups=groups)
    if refusal:
        raise NotPermitted(refusal)


def _gate(state: RunState, key, user, verb: str) -> tuple[Step, list[tuple[int, str]]]:
    """The gate, if this user may decide it now, with this attempt's decisions so far
    ((user id, decision) pairs)."""
    run = state.run
    step = state.step(key)
    require_open(run, f"{verb} {key}")
    if step.kind != StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is not an approval gate.")
    if step.status != StepStatus.WAITING_APPROVAL:
        raise IllegalTransition(f"Cannot {verb} {key}: it is {step.status}, "
                                "not waiting for approval.")
    _check_approver(run, step, user)
    with sql.cursor() as cursor:
        cursor.execute(f"SELECT user_id, decision FROM {APPROVAL.name} WHERE step_id = %s "
                       "AND attempt = %s", [step.pk, step.attempt])
        decided = cursor.fetchall()
    if any(user_id == user.pk for user_id, _ in decided):
        raise IllegalTransition(f"{user.get_username()} has already decided {key}.")
    return step, decided


def _channel(channel: str, chat_identity: str) -> tuple[str, str]:
    if channel not in Channel.values:
        raise InvalidInput(f"Unknown decision channel {channel!r}: one of "
                           f"{', '.join(Channel.values)}.")
    return channel, (chat_identity or "")[:200] if channel == Channel.CHAT else ""


def _record_decision(step: Step, user, decision: str, comment: str,
                     values: dict | None = None, *, via: tuple[str, str]) -> None:
    """Insert the decision now: the unique (step, attempt, user) is the last word on a
    second decision racing in."""
    now = clock.now()
    waited = (now - step.waiting_since).total_seconds() if step.waiting_since else None
    with sql.cursor() as cursor:
        cursor.execute(*APPROVAL.insert(APPROVAL_COLUMNS, [(
            step.pk, step.attempt, user.pk, decision, comment, values or {},
            step.approval_group, waited, now, *via)]))


def form_values(step: Step, given, *, posted: bool = False) -> dict:
    """The gate's form (approval.form) filled in: typed values, or InvalidInput naming each
    field that was refused (its `errors`, {field: problem}, for a form to show). From a
    posted HTML form (`posted`), a box that was not ticked is false."""
    fields = step.config.get("approval", {}).get("form") or []
    if not fields and not given:
        return {}
    if posted:
        given = {**{f["name"]: False for f in fields if f["type"] == "boolean"}, **given}
    try:
        return coerce(fields, given, what="field")
    except FieldErrors as exc:
        refused = InvalidInput(f"{step.title}: {exc}")
        refused.errors = exc.errors
        raise refused from None


def approve(run, key: str, *, user, comment: str = "", values: dict | None = None,
            posted: bool = False, channel: str = Channel.WEB,
            chat_identity: str = "") -> Checkpoint:
    """Record an approval, with the gate's form filled in; the gate completes when its
    quorum of distinct approvers is met. The values go into the run's shared state under
    the gate's key (a later approver's value for a field replaces an earlier one).
    `channel` says where it was made (and `chat_identity` who, for chat), for the audit."""
    comment = check_text(comment, "The comment", COMMENT_LIMIT)
    via = _channel(channel, chat_identity)
    with locked(run, key=key) as state:
        step, decided = _gate(state, key, user, "approve")
        filled = form_values(step, values, posted=posted)
        _record_decision(step, user, Decision.APPROVE, comment, filled, via=via)
        patch = {}
        if filled:
            # Earlier approvers' values stand beside these; anything else under the key
            # was not an approver's, and goes.
            shared = state.run.shared_state or {}
            earlier = shared.get(key) if key in decided_keys(state.run) else None
            earlier = earlier if isinstance(earlier, dict) else {}
            patch = merge_state(state.run, {key: {**earlier, **filled}}, gate=key)
            reserve_key(state.run, key)
        count = 1 + sum(1 for _, decision in decided if decision == Decision.APPROVE)
        evidence = {"approvals": count, "required": step.approval_required, "channel": via[0]}
        if filled:
            evidence["values"] = filled
        summary = comment or f"Approved ({count} of {step.approval_required})"
        if count >= step.approval_required:
            close_gate(step)
            step.status = StepStatus.COMPLETED
            step.finished_at = clock.now()
            step.last_summary = comment
            if patch:
                step.last_state_patch = patch
            return commit(state, CheckpointKind.STEP_APPROVED, actor=user, step=step,
                          summary=summary, evidence=evidence, state_patch=patch)
        return commit(state, CheckpointKind.APPROVAL_RECORDED, actor=user, step=step,
                      summary=summary, evidence=evidence, state_patch=patch)


def reject(run, key: str, *, user, comment: str, channel: str = Channel.WEB,
           chat_identity: str = "") -> Checkpoint:
    """Reject a gate: it fails, with the comment as its reason."""
    comment = check_text(comment, "The comment", COMMENT_LIMIT)
    via = _channel(channel, chat_identity)
    if not comment:
        raise InvalidInput("A comment is required to reject.")
    with locked(run, key=key) as state:
        step, _ = _gate(state, key, user, "reject")
        _record_decision(step, user, Decision.REJECT, comment, via=via)
        close_gate(step)
        fail_for_good(state.run, step, clock.now(), comment,
                      f"rejected by {user.get_username()}: {comment}")
        return commit(state, CheckpointKind.STEP_REJECTED, actor=user, step=step,
                      summary=comment, evidence={"channel": via[0]})


def expire_gate(step_id: int) -> Checkpoint | None:
    """A gate past its deadline is rejected or escalated, as its spec says."""
    with locked(None, step_id=step_id) as state:
        run, step = state.run, state.find(step_id)
        now = clock.now()
        if (step is None or step.status != StepStatus.WAITING_APPROVAL or run.is_terminal
                or step.deadline_at is None or step.deadline_at > now):
            return None  # decided, moved on or not due
        approval = step.config.get("approval", {})
        waited = f"{(now - step.waiting_since).total_seconds():.0f}s" if step.waiting_since else ""
        if approval.get("on_timeout") == "escalate" and not step.escalated_at:
            previous = step.approval_group
            step.approval_group = approval["escalate_to"]
            step.escalated_at = now
            close_gate(step)
            step.reminders_sent = 0  # the new group's reminders start afresh
            step.remind_at = next_reminder(step, now)
            return commit(state, CheckpointKind.GATE_ESCALATED, actor="deadline", step=step,
                          summary=f"No decision from {previous} after {waited}; escalated to "
                                  f"{step.approval_group}",
                          evidence={"from_group": previous, "to_group": step.approval_group})
        close_gate(step)
        fail_for_good(run, step, now, f"No decision from {step.approval_group} after {waited}",
                      "timed out waiting for approval")
        return commit(state, CheckpointKind.GATE_TIMED_OUT, actor="deadline", step=step,
                      summary=step.last_summary)


def remind_gate(step_id: int) -> Checkpoint | None:
    """Remind a waiting gate's approvers, when its reminder is due: a checkpoint that says
    who was reminded (the outbox mails them, and posts in the gate's chat thread), and the
    next reminder planned. Nothing once the gate is decided, its run ended or it moved on."""
    with locked(None, step_id=step_id) as state:
        run, step = state.run, state.find(step_id)
        now = clock.now()
        if (step is None or step.status != StepStatus.WAITING_APPROVAL or run.is_terminal
                or step.remind_at is None or step.remind_at > now):
            return None
        step.reminders_sent += 1
        step.remind_at = next_reminder(step, now)
        waited = (now - step.waiting_since) if step.waiting_since else None
        told = list(permissions.deciders(run, step).values_list("username", flat=True)[:50])
        summary = f"Reminder {step.reminders_sent}: {step.title} waits on {step.approval_group}"
        if waited is not None:
            summary += f" (for {duration(waited)})"
        if step.deadline_at:
            summary += f"; its deadline is in {duration(step.deadline_at - now)}"
        return commit(state, CheckpointKind.GATE_REMINDED, actor="reminder", step=step,
                      summary=summary, evidence={"reminder": step.reminders_sent,
                                                 "group": step.approval_group, "told": told})


BULK_LIMIT = 100


def decide_many(step_ids: list[int], *, user, decision: str, comment: str = ""
                ) -> tuple[list[Step], dict[int, str]]:
    """Approve or reject several gates with one comment: each through `approve` or `reject`,
    its own transaction and checkpoint, so one that cannot be decided (decided already,
    self-approval, its run moved on) holds back no other. Returns (decided gates, {gate id:
    why it was refused})."""
    if decision not in ("approve", "reject"):
        raise InvalidInput("Choose approve or reject.")
    if len(step_ids) > BULK_LIMIT:
        raise InvalidInput(f"At most {BULK_LIMIT} gates at once; {len(step_ids)} were picked.")
    decided, refused = [], {}
    gates = Step.objects.select_related("run").filter(pk__in=step_ids, kind="approval")
    for gate in gates.order_by("pk"):
        try:
            if decision == "approve":
                approve(gate.run, gate.key, user=user, comment=comment, channel=Channel.BULK)
            else:
                reject(gate.run, gate.key, user=user, comment=comment, channel=Channel.BULK)
            decided.append(gate)
        except WorkflowError as exc:
            refused[gate.pk] = str(exc)
    return decided, refused

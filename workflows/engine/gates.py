"""Approval gates: decided only by their approvers, under their quorum and self-approval
rules (see `workflows.people.permissions`), or by their deadline."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from workflows.audit import chain
from workflows.engine import facts, policy, sql
from workflows.engine.commit import commit
from workflows.engine.moves import (
    COMMENT_LIMIT,
    REASON_LIMIT,
    check_text,
    close_gate,
    decided_keys,
    evidence_changes,
    fail_for_good,
    merge_state,
    next_reminder,
    require_open,
    require_operator,
    reserve_key,
)
from workflows.engine.rows import RunState, locked
from workflows.errors import IllegalTransition, InvalidInput, NotPermitted, WorkflowError
from workflows.models import (
    Approval,
    Channel,
    Checkpoint,
    CheckpointKind,
    Decision,
    Preference,
    Step,
    StepKind,
    StepStatus,
)
from workflows.people import permissions
from workflows.specs.params import FieldErrors, coerce
from workflows.specs.values import duration
from workflows.timing import clock

APPROVAL = sql.Table(Approval)
# A decision row: what its checkpoint's digest covers, and how long the gate had waited.
APPROVAL_COLUMNS = (*chain.DECISION_FIELDS, "waited_seconds")


@dataclass(frozen=True)
class Signature:
    """A fresh proof, made at the moment of deciding, that the person deciding is the one the
    record will name: made by the page that asked for it (workflows.web.signing: their
    password, checked and counted as a sign-in is, a passkey's signature over the very
    decision, or a sign-in made again at the company's provider for it). The engine only
    takes it for that person; a channel that cannot ask for one (chat, a token, a bulk
    decision) has none."""

    user_id: int
    method: str  # "password", "passkey" or "sign-on"


REJECTED = "Rejected"  # what signing a rejection means when the spec does not say


def signature_meaning(step: Step, rule, decision: str = "approve") -> str:
    """What signing a decision (approve or reject) toward `rule` of this gate means ("" when
    it is not signed): the rule's own `signature`, else the gate's; a rejection's is its
    `reject_meaning`, "Rejected" by default."""
    approval = step.config.get("approval", {})
    signature = approval.get("signature") or {}
    if getattr(rule, "signature_meaning", ""):
        rules = policy.spec_rules(approval)
        position = getattr(rule, "position", None)
        own = rules[position].get("signature") if position is not None and (
            position < len(rules)) else None
        signature = own or {"meaning": rule.signature_meaning}
    if not signature:
        return ""
    if decision == "reject":
        return signature.get("reject_meaning") or REJECTED
    return signature.get("meaning", "")


def _signed(step: Step, rule, user, signature: Signature | None, decision: str, comment: str,
            values: dict, now) -> dict:
    """What a signed gate (or rule) records of a decision ({} for others), or NotPermitted
    when no fresh proof of this person came with it."""
    meaning = signature_meaning(step, rule, decision)
    if not meaning:
        return {}
    if signature is None or signature.user_id != user.pk:
        raise NotPermitted(
            f"{step.title} must be signed ({signature_meaning(step, rule)}): decide it on its "
            "page, in the inbox or "
            "on the run page, where you re-enter your password. A chat button, a token or a "
            "bulk decision cannot sign.")
    name = user.get_full_name() or user.get_username()
    signed = {"run": step.run_id, "step": step.key, "attempt": step.attempt,
              "decision": decision, "values": values, "comment": comment, "meaning": meaning,
              "signer": user.get_username(), "name": name, "method": signature.method,
              "at": chain.moment(now)}
    return {"meaning": meaning, "method": signature.method, "name": name,
            "signer": user.get_username(), "at": signed["at"], "digest": chain.digest(signed)}


def _gate(state: RunState, key, user, verb: str):
    """The gate, if this user may decide it now, with the rule their decision counts toward
    and whom it is made as (the user, or the person away they decide for)."""
    run = state.run
    step = state.step(key)
    require_open(run, f"{verb} {key}")
    if step.kind != StepKind.APPROVAL:
        raise IllegalTransition(f"{key} is not an approval gate.")
    if step.status != StepStatus.WAITING_APPROVAL:
        raise IllegalTransition(f"Cannot {verb} {key}: it is {step.status}, "
                                "not waiting for approval.")
    if step.deadline_at is not None and step.deadline_at <= clock.now():
        # Past its deadline the gate is the deadline's, whether or not its task has run
        # yet: a late decision is refused on every channel (the clock is the database's).
        # Said as the card says it: its title, the time in the reader's zone, what follows.
        at = timezone.localtime(step.deadline_at)
        raise IllegalTransition(f"Cannot {verb} {step.title}: its deadline passed at "
                                f"{at:%a} {at.day} {at:%b %H:%M %Z}, and it "
                                f"{deadline_then(step)} now.")
    if not permissions.signed_in(user):
        raise NotPermitted(permissions.NOT_SIGNED_IN)
    # Read under the run's lock, in one statement; the page's own reading may be stale.
    known = facts.read(user, [step], clock.now())
    rules, decided = known.rules[step.pk], known.decided[step.pk]
    state.audiences[step.pk] = known.audiences(step.pk)
    permissions.remember(user, known.groups, known.delegators)
    chosen = permissions.choose_rule(user, run, step, rules, decided, known.people(user))
    if isinstance(chosen, str):
        # Deciding twice is a conflict with the record, not a matter of permission.
        raise (IllegalTransition if user.pk in decided else NotPermitted)(chosen)
    rule, person = chosen
    return step, rules, rule, (person if person.delegated else None)


def deadline_then(step: Step) -> str:
    """What a gate does at its deadline, in words: "escalates to ops" or "rejects itself"."""
    approval = step.config.get("approval", {})
    if approval.get("on_timeout") == "escalate" and not step.escalated_at:
        return f"escalates to {approval.get('escalate_to')}"
    return "rejects itself"


def _channel(channel: str, chat_identity: str) -> tuple[str, str]:
    if channel not in Channel.values:
        raise InvalidInput(f"Unknown decision channel {channel!r}: one of "
                           f"{', '.join(Channel.values)}.")
    # Who, on a chat: the account; a mail reply: its Message-ID.
    identified = channel in (Channel.CHAT, Channel.MAIL_REPLY)
    return channel, (chat_identity or "")[:200] if identified else ""


def _record_decision(step: Step, user, decision: str, comment: str,
                     values: dict | None = None, *, via: tuple[str, str], rule,
                     for_person, signature: Signature | None = None) -> tuple[dict, dict]:
    """Insert the decision now: the unique (step, attempt, user) is the last word on a
    second decision racing in. Returns what its signature recorded ({} if none), and what
    its checkpoint records of the row (who, and the row's digest: the chain covers it)."""
    now = clock.now()
    signed = _signed(step, rule, user, signature, decision, comment, values or {}, now)
    waited = (now - step.waiting_since).total_seconds() if step.waiting_since else None
    row = dict(zip(chain.DECISION_FIELDS, (
        step.pk, step.attempt, user.pk, decision, comment, values or {}, rule.audience[:150],
        now, *via, rule.pk, for_person.pk if for_person else None, signed.get("meaning", ""),
        signed.get("method", ""), signed.get("name", ""), signed.get("digest", ""),
        step.evidence_digest), strict=True))
    with sql.cursor() as cursor:
        cursor.execute(*APPROVAL.insert(APPROVAL_COLUMNS, [(*row.values(), waited)]))
    # The decision's checkpoint carries its row's digest: the chain vouches for the row.
    return signed, {"user": user.pk, "digest": chain.decision_digest(row)}


def _decision_evidence(rules, rule, for_person, via, opened) -> dict:
    """What a decision's checkpoint says of the rules: the one it counted toward, whom it
    was made for, each rule's standing, and the stage it opened."""
    evidence = {"channel": via[0], **({"message_id": via[1]} if via[0] == Channel.MAIL_REPLY
                                      else {}), "rule": rule.label,
                "rules": [{"rule": r.label, "waits_on": r.audience, "approvals": r.approvals,
                           "required": r.required, "met": r.met} for r in rules]}
    if for_person:
        evidence["for"] = for_person.name
    if opened:
        evidence["stage_opened"] = [r.label for r in opened]
    return evidence


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


def _as_seen(step: Step, seen: str | None) -> None:
    """Every channel's decision carries the evidence digest the person was shown (`seen`:
    a page's form, a chat button, a bulk checkbox's card, the API's `seen`): if the
    evidence changed since, the decision is refused, saying what changed, not recorded on
    what the person did not see. None: code deciding with the gate in hand (the demo, a
    test), never a door."""
    if seen is None or seen == step.evidence_digest:
        return
    if not seen:
        raise InvalidInput(f"Say which evidence of {step.title} you decided on (the gate's "
                           "evidence_digest, as the page, the message or GET of the run "
                           "shows it): nothing was decided.")
    changes = evidence_changes(step, seen)
    what = f" What changed: {'; '.join(changes)}." if changes else ""
    if step.attempt > 1 and step.last_summary:  # why this attempt began
        what += f" {step.last_summary}"
    raise IllegalTransition(
        f"{step.title} changed after it was shown to you (the run's values or outputs moved "
        f"on): nothing was decided.{what} Look again at what it shows now.")


def approve(run, key: str, *, user, comment: str = "", values: dict | None = None,
            posted: bool = False, channel: str = Channel.WEB,
            chat_identity: str = "", signature: Signature | None = None,
            seen: str | None = None) -> Checkpoint:
    """Record an approval, with the gate's form filled in; the gate completes when its
    quorum of distinct approvers is met. The values go into the run's shared state under
    the gate's key (a later approver's value for a field replaces an earlier one).
    `channel` says where it was made (and `chat_identity` who, for chat, or which mail, for
    a mail reply), for the audit."""
    comment = check_text(comment, "The comment", COMMENT_LIMIT)
    via = _channel(channel, chat_identity)
    with locked(run, key=key) as state:
        step, rules, rule, for_person = _gate(state, key, user, "approve")
        _as_seen(step, seen)
        filled = form_values(step, values, posted=posted)
        signed, recorded = _record_decision(step, user, Decision.APPROVE, comment, filled,
                                            via=via, rule=rule, for_person=for_person,
                                            signature=signature)
        now = clock.now()
        opened = policy.count(rule, rules, Decision.APPROVE, now)
        policy.summarize(step, rules)
        patch = {}
        if step.config.get("approval", {}).get("form"):
            # Every approval of a gate with a form takes its key, filled or not, so no value
            # of the requester's (before or after) stands in for an approver's choice.
            # Earlier approvers' values stand beside these; anything else under the key
            # was not an approver's, and goes.
            shared = state.run.shared_state or {}
            earlier = shared.get(key) if key in decided_keys(state.run) else None
            earlier = earlier if isinstance(earlier, dict) else {}
            patch = merge_state(state.run, {key: {**earlier, **filled}}, gate=key)
            reserve_key(state.run, key)
        count = sum(r.approvals for r in rules)
        evidence = {"approvals": count, "required": step.approval_required,
                    **_decision_evidence(rules, rule, for_person, via, opened),
                    "decision": recorded}
        if filled:
            evidence["values"] = filled
        summary = comment or f"Approved ({count} of {step.approval_required})"
        if for_person:
            summary = f"For {for_person.name}: {summary}"
        if signed:
            evidence["signature"] = signed
            summary = f"{summary} · signed by {signed['name']}: {signed['meaning']}"
        if all(r.met for r in rules):
            close_gate(step)
            step.status = StepStatus.COMPLETED
            step.finished_at = now
            step.last_summary = comment
            if patch:
                step.last_state_patch = patch
            return commit(state, CheckpointKind.STEP_APPROVED, actor=user, step=step,
                          summary=summary, evidence=evidence, state_patch=patch)
        if opened:  # the next stage's approvers are reminded on their own clock
            step.reminders_sent = 0
            step.remind_at = next_reminder(step, now)
        return commit(state, CheckpointKind.APPROVAL_RECORDED, actor=user, step=step,
                      summary=summary, evidence=evidence, state_patch=patch)


def reject(run, key: str, *, user, comment: str, channel: str = Channel.WEB,
           chat_identity: str = "", signature: Signature | None = None,
           seen: str | None = None) -> Checkpoint:
    """Reject a gate. Under `"reject": "any"` (the default) it fails, with the comment as
    its reason; under `"reject": "quorum"` it fails once a rule has as many rejections as
    it needs approvals, and until then the rejection is recorded."""
    comment = check_text(comment, "The comment", COMMENT_LIMIT)
    via = _channel(channel, chat_identity)
    if not comment:
        raise InvalidInput("A comment is required to reject.")
    with locked(run, key=key) as state:
        step, rules, rule, for_person = _gate(state, key, user, "reject")
        _as_seen(step, seen)
        signed, recorded = _record_decision(step, user, Decision.REJECT, comment, via=via,
                                            rule=rule, for_person=for_person,
                                            signature=signature)
        policy.count(rule, rules, Decision.REJECT, clock.now())
        evidence = {**_decision_evidence(rules, rule, for_person, via, []),
                    "decision": recorded}
        if signed:
            evidence["signature"] = signed
        by = f"{user.get_username()}" + (f" for {for_person.name}" if for_person else "")
        if (step.config.get("approval", {}).get("reject", "any") == "quorum"
                and rule.rejections < rule.required):
            return commit(state, CheckpointKind.REJECTION_RECORDED, actor=user, step=step,
                          summary=f"Rejected by {by} ({rule.rejections} of {rule.required} "
                                  f"rejections end it): {comment}",
                          evidence={**evidence, "rejections": rule.rejections})
        close_gate(step)
        policy.close_rules(step)
        fail_for_good(state.run, step, clock.now(), comment, f"rejected by {by}: {comment}")
        return commit(state, CheckpointKind.STEP_REJECTED, actor=user, step=step,
                      summary=comment if not for_person else f"For {for_person.name}: {comment}",
                      evidence=evidence)


def expire_gate(step_id: int) -> Checkpoint | None:
    """A gate past its deadline is rejected or escalated, as its spec says."""
    with locked(None, step_id=step_id) as state:
        run, step = state.run, state.find(step_id)
        now = clock.database_now()  # never a process's clock: it may have stepped
        if (step is None or step.status != StepStatus.WAITING_APPROVAL or run.is_terminal
                or step.deadline_at is None or step.deadline_at > now):
            return None  # decided, moved on or not due
        approval = step.config.get("approval", {})
        # The time it was given, not how late the deadline task came.
        waited = duration(approval.get("timeout_seconds")) or (
            duration(step.deadline_at - step.waiting_since) if step.waiting_since else "")
        if approval.get("on_timeout") == "escalate" and not step.escalated_at:
            previous = step.approval_group
            rules = policy.rules_of(step)
            # Whoever the gate waits on now did not decide in time: the group decides.
            for rule in rules:
                if rule.open:
                    previous = policy.retarget(rule, group=approval["escalate_to"])
            policy.summarize(step, rules)
            step.escalated_at = now
            close_gate(step)
            step.reminders_sent = 0  # the new group's reminders start afresh
            step.remind_at = next_reminder(step, now)
            return commit(state, CheckpointKind.GATE_ESCALATED, actor="deadline", step=step,
                          summary=f"No decision from {previous} after {waited}; escalated to "
                                  f"{step.approval_group}",
                          evidence={"from_group": previous, "to_group": step.approval_group})
        close_gate(step)
        policy.close_rules(step)
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
        now = clock.database_now()
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


def decide_many(step_ids: list[int], *, user, decision: str, comment: str = "",
                seen: dict[int, str] | None = None) -> tuple[list[Step], dict[int, str]]:
    """Approve or reject several gates with one comment: each through `approve` or `reject`,
    its own transaction and checkpoint, so one that cannot be decided (decided already,
    self-approval, its run moved on, its evidence changed since `seen[gate id]` was shown)
    holds back no other. Returns (decided gates, {gate id: why it was refused})."""
    seen = seen or {}
    if decision not in ("approve", "reject"):
        raise InvalidInput("Choose approve or reject.")
    if len(step_ids) > BULK_LIMIT:
        raise InvalidInput(f"At most {BULK_LIMIT} gates at once; {len(step_ids)} were picked.")
    decided, refused = [], {}
    gates = Step.objects.select_related("run").filter(pk__in=step_ids, kind="approval")
    for gate in gates.order_by("pk"):
        try:
            if decision == "approve":
                checkpoint = approve(gate.run, gate.key, user=user, comment=comment,
                                     channel=Channel.BULK, seen=seen.get(gate.pk, ""))
            else:
                checkpoint = reject(gate.run, gate.key, user=user, comment=comment,
                                    channel=Channel.BULK, seen=seen.get(gate.pk, ""))
            gate.decided_for = (checkpoint.evidence or {}).get("for", "")  # as whose delegate
            decided.append(gate)
        except WorkflowError as exc:
            refused[gate.pk] = str(exc)
    return decided, refused


def _check_can_be_met(run, step, rule, actor, *, group: str, person) -> None:
    """A reassignment must leave the rule enough people who may fill it: not the operator
    who reassigns it (no one hands a gate to themselves), not the requester (unless the
    rule allows it), not anyone who decided this attempt already. InvalidInput says how
    many it needs and how many it would have."""
    from django.contrib.auth import get_user_model

    if person is not None and permissions.is_person(actor) and person.pk == actor.pk:
        raise InvalidInput(f"{actor.get_username()} cannot reassign {step.title} to "
                           "themselves: an operator hands a gate to someone else.")
    # Nor to someone away whose delegate they are: they would decide it all the same.
    if person is not None and permissions.is_person(actor) and Preference.objects.filter(
            user=person, delegate=actor, away_until__gt=clock.now()).exists():
        raise InvalidInput(
            f"{actor.get_username()} cannot reassign {step.title} to "
            f"{person.get_username()}, who is away with {actor.get_username()} as "
            "their delegate: an operator hands a gate to someone else.")
    needed = rule.required - rule.approvals
    excluded = permissions.decided_people(step)
    if permissions.is_person(actor):
        excluded.add(actor.pk)
    if not rule.allow_self_approval and run.requested_by_id:
        excluded.add(run.requested_by_id)
    if person is not None:
        eligible = 0 if person.pk in excluded else 1
        whom = person.get_username()
    else:
        eligible = (get_user_model().objects.filter(groups__name=group, is_active=True)
                    .exclude(pk__in=excluded).distinct().count())
        whom = f"the {group} group"
    if eligible < needed:
        raise InvalidInput(
            f"{step.title} ({rule.label}) needs {needed} more approval"
            f"{'s' if needed != 1 else ''} from distinct people; {whom} would leave "
            f"{eligible} who may give one (not the requester, not whoever reassigns it, not "
            "those who decided already): reassign it to a group with enough people.")


def reassign_gate(run, key: str, *, actor, reason: str, group: str = "", person=None,
                  rule: str = "") -> Checkpoint:
    """An operator points a waiting gate at another group or person (`group`, or `person`:
    a user or a username), with a reason: a checkpoint, and the new approvers are told. A
    gate waiting on several rules needs `rule` (its label) to say which moves; decisions
    already counted stay."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    require_operator(actor, f"reassign {key}")
    reason = check_text(reason, "The reason", REASON_LIMIT)
    if not reason:
        raise InvalidInput("Say why the gate is reassigned: the reason is required.")
    group = (group or "").strip()
    if isinstance(person, str):
        name = person.strip()
        person = get_user_model().objects.filter(username=name, is_active=True).first() if (
            name) else None
        if name and person is None:
            raise InvalidInput(f"There is no active person named {name!r}.")
    if bool(group) == (person is not None):
        raise InvalidInput("Reassign to a group or to a person: name exactly one.")
    if group and not Group.objects.filter(name=group).exists():
        raise InvalidInput(f"There is no group named {group!r}.")
    if person is not None and not (permissions.is_person(person) and person.is_active):
        raise InvalidInput("A gate can be reassigned only to an active person.")
    with locked(run, key=key) as state:
        step = state.step(key)
        require_open(state.run, f"reassign {key}")
        if step.kind != StepKind.APPROVAL or step.status != StepStatus.WAITING_APPROVAL:
            raise IllegalTransition(f"Cannot reassign {step.title}: only a gate waiting for "
                                    "approval can be reassigned.")
        rules = policy.rules_of(step)
        waiting = [r for r in rules if r.open and (not rule or r.label == rule)]
        if not waiting:
            raise InvalidInput(f"{step.title} has no waiting rule named {rule!r}; it waits on "
                               f"{', '.join(r.label for r in rules if r.open)}.")
        if len(waiting) > 1:
            labels = ", ".join(r.label for r in waiting)
            raise InvalidInput(f"{step.title} waits on several rules ({labels}): name the one to "
                               "reassign.")
        target = waiting[0]
        if (person is not None and person.pk == state.run.requested_by_id
                and not target.allow_self_approval):
            raise InvalidInput(f"{person.get_username()} requested run {state.run.pk} and "
                               f"cannot decide {step.title}: reassign it to someone else.")
        _check_can_be_met(state.run, step, target, actor, group=group, person=person)
        before = policy.retarget(target, group=group, user=person)
        policy.summarize(step, rules)
        now = clock.now()
        step.reminders_sent = 0  # the new approvers' reminders start afresh
        step.remind_at = next_reminder(step, now)
        return commit(state, CheckpointKind.GATE_REASSIGNED, actor=actor, step=step,
                      summary=f"Reassigned from {before} to {target.audience}: {reason}",
                      evidence={"rule": target.label, "from": before, "to": target.audience,
                                "reason": reason})

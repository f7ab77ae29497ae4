"""Approval policy: the rules a gate's attempt must meet, as they matched the run when the
gate started waiting (`GateRule` rows), and how decisions move them.

Every rule of the spec whose `when` holds applies; each is met by `required` approvals from
distinct people (a person's decision counts toward one rule only). Rules open by stage: the
lowest `order` first, the next once all of it is met. Who may fill a rule is
`permissions.choose_rule`, the one gate rule every entry point asks.
"""

from __future__ import annotations

from ..models import GateRule, Preference, Step
from . import sql
from .rules import rule_applies

RULES = sql.Table(GateRule)


def _save(rule: GateRule, *names: str) -> None:
    """Write these columns of the rule (the engine's own statement: the ORM's building cost
    more than the update)."""
    with sql.cursor() as cursor:
        cursor.execute(*RULES.update(rule.pk, {name: getattr(rule, name) for name in names}))


def spec_rules(approval: dict) -> list[dict]:
    """The gate's rules as its spec writes them; the plain group/required form is one rule."""
    if "rules" in approval:
        return approval["rules"]
    return [{"group": approval.get("group", ""), "required": approval.get("required", 1),
             "allow_self_approval": approval.get("allow_self_approval", False), "order": 0}]


def state_read(config: dict) -> set[str]:
    """The shared-state keys (top level) a gate's approval rules read in their `when`."""
    return {rule["when"]["state"].split(".")[0]
            for rule in spec_rules(config.get("approval", {}))
            if isinstance(rule.get("when"), dict) and "state" in rule["when"]}


def manager_of(user_id: int | None) -> int | None:
    """The active manager a person's preference names, if any."""
    if user_id is None:
        return None
    return (Preference.objects.filter(user_id=user_id, manager__is_active=True)
            .values_list("manager_id", flat=True).first())


def matched_rules(gate: Step) -> list[GateRule]:
    """New rule rows for the gate's attempt: the spec's rules whose `when` holds on the run's
    params and state now, the requester's manager looked up for a manager rule."""
    run = gate.run
    rows = []
    for position, rule in enumerate(spec_rules(gate.config.get("approval", {}))):
        if rule.get("when") and not rule_applies(rule["when"], run.shared_state or {},
                                                 run.params or {})[0]:
            continue
        group, user_id, role = rule.get("group", ""), None, ""
        label = rule.get("label") or group
        if rule.get("manager"):
            user_id = manager_of(run.requested_by_id)
            # No manager on record: the rule's group (validation requires one) decides.
            group = "" if user_id else group
            role = f"{run.requested_by.get_username()}'s manager" if user_id else ""
        rows.append(GateRule(step=gate, attempt=gate.attempt, position=position,
                             order=rule.get("order", 0), label=label[:200], group=group,
                             user_id=user_id, role=role[:200], required=rule.get("required", 1),
                             allow_self_approval=rule.get("allow_self_approval", False),
                             signature_meaning=rule.get("signature", {}).get("meaning", "")))
    return rows


def rules_of(gate: Step) -> list[GateRule]:
    """The rules of the gate's current attempt, stage by stage."""
    return list(GateRule.objects.filter(step=gate, attempt=gate.attempt)
                .select_related("user").order_by("order", "position"))


def open_rules(gate: Step, now) -> list[GateRule]:
    """The gate starts waiting: its attempt's rules (made now, or as they were when it last
    waited, with the approvals they had), the first unmet stage opened."""
    rules = rules_of(gate)
    if not rules:
        rules = sorted(GateRule.objects.bulk_create(matched_rules(gate)),
                       key=lambda rule: (rule.order, rule.position))
    open_next_stage(rules, now)
    summarize(gate, rules)
    return rules


def open_next_stage(rules: list[GateRule], now) -> list[GateRule]:
    """Open the unmet rules of the lowest stage that has any, if none is open; returns the
    rules it opened (their approvers are told)."""
    unmet = [rule for rule in rules if not rule.met]
    if not unmet or any(rule.open for rule in unmet):
        return []
    stage = min(rule.order for rule in unmet)
    opened = [rule for rule in unmet if rule.order == stage]
    for rule in opened:
        rule.open, rule.opened_at = True, rule.opened_at or now
        _save(rule, "open", "opened_at")
    return opened


def count(rule: GateRule, rules: list[GateRule], decision: str, now) -> list[GateRule]:
    """A decision toward `rule`: an approval that meets it closes it and may open the next
    stage (returned); a rejection is counted."""
    if decision == "reject":
        rule.rejections += 1
        _save(rule, "rejections")
        return []
    rule.approvals += 1
    if rule.approvals >= rule.required:
        rule.met_at, rule.open = now, False
    _save(rule, "approvals", "met_at", "open")
    return open_next_stage(rules, now)


def close_rules(gate: Step) -> None:
    """The gate no longer waits (decided, timed out, its run failed or was cancelled)."""
    GateRule.objects.filter(step=gate, open=True).update(open=False)


def close_rules_of_run(run) -> None:
    """The run was cancelled: none of its gates waits any more."""
    GateRule.objects.filter(step__run=run, open=True).update(open=False)


def summarize(gate: Step, rules: list[GateRule]) -> None:
    """The gate's own columns that pages and chat show: the group it waits on now (the
    first open rule's) and the approvals it needs in all."""
    waiting = [rule for rule in rules if rule.open] or rules
    gate.approval_group = next((rule.group for rule in waiting if rule.group), "")
    gate.approval_required = max(1, sum(rule.required for rule in rules))


def retarget(rule: GateRule, *, group: str = "", user=None) -> str:
    """Point a rule at another group or person; returns whom it waited on before."""
    before = rule.audience
    rule.group, rule.user, rule.role = group, user, ""
    _save(rule, "group", "user_id", "role")
    return before

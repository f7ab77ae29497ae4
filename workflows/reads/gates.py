"""The gate as a person sees it: for a person and any number of gates, what a card, the run
page, a decision link's page and a chat view show or check about each gate, in a constant
number of statements.

Each gate gets, beside its brief (`briefs.gate_evidence`: instructions, trail, decisions,
rules in words, deadline, evidence digest):
- `refusal`: why this person may not decide it now ("" when they may; `decided_by_you` when
  they have, themselves or through a delegate), from the same facts (`engine.facts`) and the
  same rule (`permissions.choose_rule`) the engine decides with;
- `deciding_rule` and `deciding_for`: the rule their decision counts toward, and the person
  away they would decide it for (None when for themselves);
- `signing` and `reject_signing`: what signing their approval, or rejection, means ("" when
  it is not signed); `page_only`: why only its page can decide it ("" when a press can);
- with `audience`: `others` (who else may decide it now) and `told` (who was mailed of it
  this attempt, and when, newest first).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db.models import F, QuerySet

from workflows.engine import facts, signature_meaning
from workflows.models import GateRule, Notification, Step
from workflows.people import permissions
from workflows.reads import briefs
from workflows.timing import clock

# The orders of the gates waiting on someone: how long a gate has waited (the default), or its
# deadline (those without one last); both served by the partial indexes on waiting gates.
SORTS = {"age": ("waiting_since", "pk"),
         "deadline": (F("deadline_at").asc(nulls_last=True), "waiting_since", "pk")}


def waiting_on(user, *, sort: str = "age", group: str = "", spec: str = "",
               goal: int | None = None) -> QuerySet[Step]:
    """The gates waiting on this person now (`permissions.decidable_by`: as themselves or for
    someone away), those of a group's open rule, a workflow or a goal, in the inbox's order."""
    gates = permissions.decidable_by(user)
    if group:  # a gate waiting on that group now (any of its open rules)
        gates = gates.filter(pk__in=GateRule.objects.filter(
            group=group, open=True).values("step_id"))
    if spec:
        gates = gates.filter(run__spec_name=spec)
    if goal is not None:
        gates = gates.filter(run__goal_id=goal)
    return gates.order_by(*SORTS[sort])


def seen_by(user, gates: list[Step], *, brief: bool = True, audience: bool = True
            ) -> list[Step]:
    """Give each gate what `user` sees and may do of it (see the module's docstring).
    `brief`: the card's evidence too (a page that shows the run has it already, and may
    give each gate its `decisions` of every attempt); `audience`: who else may decide, who was
    told. Statements: one for the facts, three for the brief (or one for the decisions
    where not given), two for the audience, whatever the count of gates."""
    if not gates:
        return gates
    known = facts.read(user, gates, clock.now())
    permissions.remember(user, known.groups, known.delegators)
    if brief:
        briefs.gate_evidence(gates, rules=known.rules)
    else:  # the page's `decisions` (of every attempt: it shows those no longer counting)
        if any(not hasattr(gate, "decisions") for gate in gates):
            decided = briefs.decisions_by_gate(gates)
            for gate in gates:
                gate.decisions = decided.get(gate.pk, [])
        now = clock.now()
        for gate in gates:
            gate.approved = briefs.approvals_of_attempt(gate.decisions, gate.attempt)[1]
            briefs.describe_rules(gate, known.rules[gate.pk])
            gate.due = briefs.deadline(gate, now)
    people = known.people(user)
    for gate in gates:
        _may_decide(user, gate, known.decided[gate.pk], people)
    if audience:
        _audience(user, gates, known)
    return gates


def _may_decide(user, gate: Step, decided: set[int], people) -> None:
    gate.decided_by_you = user.pk in decided
    chosen = permissions.decision_as(user, gate.run, gate, rules=gate.rules, decided=decided,
                                     people=people)
    gate.refusal = chosen if isinstance(chosen, str) else ""
    rule, person = (None, None) if gate.refusal else chosen
    gate.deciding_rule = rule
    gate.deciding_for = person if person is not None and person.delegated else None
    gate.signing = signature_meaning(gate, rule) if rule else ""
    gate.reject_signing = signature_meaning(gate, rule, "reject") if rule else ""
    gate.page_only = briefs.page_only(gate)


def _audience(user, gates: list[Step], known: facts.GateFacts) -> None:
    """`others` and `told` of each gate: two statements for any number of gates."""
    members = defaultdict(list)
    groups = {rule.group for gate in gates for rule in gate.rules if rule.open and rule.group}
    for group, pk, name in (get_user_model().objects.filter(
            is_active=True, groups__name__in=groups)
            .values_list("groups__name", "pk", "username").order_by("username")):
        members[group].append((pk, name))
    told = defaultdict(list)
    notes = (Notification.objects.filter(
        run_id__in={gate.run_id for gate in gates},
        event__in=("gate_waiting", "gate_escalated", "gate_reminded", "gate_reassigned"))
        .values_list("run_id", "key", "event", "user__username", "created_at")
        .order_by("-created_at", "-pk"))
    for run_id, key, event, name, at in notes:
        told[(run_id, key.rsplit(":", 1)[-1])].append(
            {"user": name, "at": at, "reminder": event == "gate_reminded"})
    for gate in gates:
        decided = known.decided[gate.pk]
        others = {}
        for rule in gate.rules:
            if not rule.open:
                continue
            people = members[rule.group] if rule.group else [(rule.user_id, rule.audience)]
            for pk, name in people:
                if pk != user.pk and pk not in decided and (
                        rule.allow_self_approval or pk != gate.run.requested_by_id):
                    others.setdefault(pk, name)
        gate.others = sorted(others.values())
        # Mail of earlier attempts is older than this one's start; mail is recorded after
        # its checkpoint commits, and the margin covers clocks of different processes.
        since = gate.waiting_since - timedelta(seconds=5) if gate.waiting_since else None
        gate.told = [t for t in told[(gate.run_id, gate.key)] if since is None or t["at"] >= since]

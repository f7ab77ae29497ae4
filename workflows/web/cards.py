"""The card: what an approver reads on a gate's card (the brief of `workflows.reads.briefs`, with
the gate's form), and the inbox's gates built from it."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db.models import Count, F, Q

from workflows import engine
from workflows.models import GateRule, Notification, Step
from workflows.people.permissions import decidable_by, deciding_as, named_in_rules
from workflows.reads import briefs
from workflows.reads.briefs import (  # noqa: F401  (the card's read model, named here too)
    VALUE_CHARS,
    approvals_of_attempt,
    brief,
    consequences,
    deadline,
    decided_people,
    decisions_by_gate,
    describe_rules,
    due_gates,
    fill_placeholders,
    params_of,
    rules_by_gate,
    short,
    trail_entry,
)
from workflows.web.forms import gate_form

# The inbox shows this many gates, the oldest first: a page that stays quick whatever the
# backlog, and the ones to decide first.
INBOX_LIMIT = 50


# The inbox's orders: how long a gate has waited (the default), or its deadline (those
# without one last); both served by the partial indexes on waiting gates.
SORTS = {"age": ("waiting_since", "pk"),
         "deadline": (F("deadline_at").asc(nulls_last=True), "waiting_since", "pk")}


def inbox_query(user, view: dict | None = None):
    """The gates waiting on this user, narrowed and ordered as the inbox's URL asks
    (`view`: sort, group, spec, goal; see forms.InboxView)."""
    view = view or {}
    gates = decidable_by(user)
    if view.get("group"):  # a gate waiting on that group now (any of its open rules)
        gates = gates.filter(pk__in=GateRule.objects.filter(
            group=view["group"], open=True).values("step_id"))
    if view.get("spec"):
        gates = gates.filter(run__spec_name=view["spec"])
    if view.get("goal"):
        gates = gates.filter(run__goal_id=view["goal"].pk)
    return gates.order_by(*SORTS[view.get("sort") or "age"])


def inbox_choices(user) -> dict:
    """What the inbox's filters offer: the groups, workflows and goals of the gates waiting
    on this user (one query)."""
    rows = set(decidable_by(user).filter(approval_rules__open=True).order_by().values_list(
        "approval_rules__group", "run__spec_name", "run__goal_id", "run__goal__title")
        .distinct())
    return {"group_choices": sorted({row[0] for row in rows if row[0]}),
            "spec_choices": sorted({row[1] for row in rows}),
            "goal_choices": sorted({(row[2], row[3]) for row in rows if row[2]},
                                   key=lambda goal: goal[1])}


def inbox_gates(user, view: dict | None = None) -> list:
    """The first INBOX_LIMIT gates of the inbox's view, each with its evidence and who else
    may decide it and who was told of it."""
    gates = gate_evidence(list(inbox_query(user, view).select_related(
        "run", "run__spec", "run__goal", "run__requested_by",
        "run__parent_step")[:INBOX_LIMIT]))
    audiences(gates, user)
    signing(gates, user)
    return gates


def signing(gates: list, user) -> None:
    """Set each gate's `signing` and `reject_signing` (what signing this user's approval,
    and rejection, on it means, for the rule it would count toward; "" when unsigned) and
    `deciding_for` (the person away this user would decide it for, with when they are
    back; None when for themselves). No query (the rules and delegations are read)."""
    for gate in gates:
        rule, person = deciding_as(user, gate.run, gate, rules=gate.rules,
                                   decided=decided_people(getattr(gate, "decisions", [])))
        gate.signing = engine.signature_meaning(gate, rule)
        gate.reject_signing = engine.signature_meaning(gate, rule, "reject")
        gate.deciding_for = person if person is not None and person.delegated else None


def audiences(gates: list, user) -> None:
    """Set each gate's `others` (who else may decide it now: its open rules' approvers,
    less the requester where self-approval is not allowed, less whoever decided) and `told`
    (who was mailed of it this attempt, and when, newest first): two queries for any number
    of gates (their `rules` read already)."""
    members = defaultdict(list)
    groups = {rule.group for gate in gates for rule in gate.rules if rule.open and rule.group}
    for group, pk, name in (get_user_model().objects.filter(
            is_active=True, groups__name__in=groups)
            .values_list("groups__name", "pk", "username").order_by("username")):
        members[group].append((pk, name))
    told = defaultdict(list)
    if gates:
        notes = (Notification.objects.filter(
            run_id__in={gate.run_id for gate in gates},
            event__in=("gate_waiting", "gate_escalated", "gate_reminded", "gate_reassigned"))
            .values_list("run_id", "key", "event", "user__username", "created_at")
            .order_by("-created_at", "-pk"))
        for run_id, key, event, name, at in notes:
            told[(run_id, key.rsplit(":", 1)[-1])].append(
                {"user": name, "at": at, "reminder": event == "gate_reminded"})
    for gate in gates:
        decided = decided_people(getattr(gate, "decisions", []))
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


def inbox_versions(user, view: dict | None = None) -> dict[int, str]:
    """The inbox's gates by id with their `version` (see gate_evidence), in one query and
    without their evidence: what a live inbox's poll compares before it builds any card."""
    rows = (inbox_query(user, view)
            .annotate(decided=Count("approvals", filter=Q(approvals__attempt=F("attempt"))))
            .values_list("pk", "attempt", "decided")[:INBOX_LIMIT])
    return {pk: f"{attempt}.{decided}" for pk, attempt, decided in rows}


def gate_evidence(gates: list) -> list:
    """The brief of each gate (briefs.gate_evidence) and its `form`."""
    briefs.gate_evidence(gates)
    for gate in gates:
        gate.form = gate_form(gate)
    return gates


def gates_left(user, step_ids: list[int]) -> list[Step]:
    """Gates an open inbox still shows that no longer wait on this user (decided by others,
    or their run moved on), each with this attempt's `decisions`: the cards turn into their
    decided state. Only gates whose rules name the user (or their groups, or someone they
    decide for): an inbox cannot probe other steps."""
    if not step_ids:
        return []
    gates = list(Step.objects.filter(pk__in=step_ids[:200], kind="approval")
                 .filter(pk__in=named_in_rules(user)).select_related("run").order_by("pk"))
    decided = decisions_by_gate(gates)
    for gate in gates:
        gate.decisions = approvals_of_attempt(decided.get(gate.pk, []), gate.attempt)[0]
        gate.mine = [d for d in gate.decisions if d.user_id == user.pk]
    return gates

"""The card: what an approver reads on a gate's card (the brief of `workflows.briefs`, with
the gate's form), and the inbox's gates built from it."""

from __future__ import annotations

from django.db.models import Count, F, Q

from workflows import briefs
from workflows.briefs import (  # noqa: F401  (the card's read model, named here too)
    VALUE_CHARS,
    approvals_of_attempt,
    brief,
    consequences,
    deadline,
    decisions_by_gate,
    due_gates,
    fill_placeholders,
    params_of,
    short,
    trail_entry,
)
from workflows.models import Step
from workflows.permissions import decidable_by
from workflows.web.forms import gate_form

# The inbox shows this many gates, the oldest first: a page that stays quick whatever the
# backlog, and the ones to decide first.
INBOX_LIMIT = 50


def inbox_gates(user) -> list:
    """The oldest gates waiting on this user (at most INBOX_LIMIT), each with its evidence."""
    return gate_evidence(list(decidable_by(user).select_related(
        "run", "run__spec", "run__goal", "run__requested_by")[:INBOX_LIMIT]))


def inbox_versions(user) -> dict[int, str]:
    """The inbox's gates by id with their `version` (see gate_evidence), in one query and
    without their evidence: what a live inbox's poll compares before it builds any card."""
    rows = (decidable_by(user)
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
    decided state. Only gates of the user's groups: an inbox cannot probe other steps."""
    if not step_ids:
        return []
    gates = list(Step.objects.filter(pk__in=step_ids[:200], kind="approval",
                                     approval_group__in=user.groups.values("name"))
                 .select_related("run").order_by("pk"))
    decided = decisions_by_gate(gates)
    for gate in gates:
        gate.decisions = approvals_of_attempt(decided.get(gate.pk, []), gate.attempt)[0]
        gate.mine = [d for d in gate.decisions if d.user_id == user.pk]
    return gates

"""The card: a gate as its reader sees it (`workflows.reads.gates`) with the gate's form, and
the inbox's gates built from it."""

from __future__ import annotations

from django.db.models import Count, F, Q

from workflows.models import Step
from workflows.people.permissions import decidable_by, named_in_rules
from workflows.reads import briefs
from workflows.reads import gates as gates_seen
from workflows.web.forms import gate_form

# The inbox shows this many gates, the oldest first: a page that stays quick whatever the
# backlog, and the ones to decide first.
INBOX_LIMIT = 50


def inbox_query(user, view: dict | None = None):
    """The gates waiting on this user, narrowed and ordered as the inbox's URL asks
    (`view`: sort, group, spec, goal; see forms.InboxView)."""
    view = view or {}
    return gates_seen.waiting_on(user, sort=view.get("sort") or "age",
                                 group=view.get("group") or "", spec=view.get("spec") or "",
                                 goal=getattr(view.get("goal"), "pk", None))


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
    """The first INBOX_LIMIT gates of the inbox's view, each as this user sees it (evidence,
    who else may decide it and who was told) with its form."""
    return seen_by(user, list(inbox_query(user, view).select_related(
        "run", "run__spec", "run__goal", "run__requested_by",
        "run__parent_step")[:INBOX_LIMIT]))


def seen_by(user, gates: list) -> list:
    """Each gate as `user` sees it (`workflows.reads.gates`), and its `form`."""
    gates_seen.seen_by(user, gates)
    for gate in gates:
        gate.form = gate_form(gate)
    return gates


def inbox_versions(user, view: dict | None = None) -> dict[int, str]:
    """The inbox's gates by id with their `version` (see briefs.gate_evidence), in one query and
    without their evidence: what a live inbox's poll compares before it builds any card."""
    rows = (inbox_query(user, view)
            .annotate(decided=Count("approvals", filter=Q(approvals__attempt=F("attempt"))))
            .values_list("pk", "attempt", "decided")[:INBOX_LIMIT])
    return {pk: f"{attempt}.{decided}" for pk, attempt, decided in rows}


def gates_left(user, step_ids: list[int]) -> list[Step]:
    """Gates an open inbox still shows that no longer wait on this user (decided by others,
    or their run moved on), each with this attempt's `decisions`: the cards turn into their
    decided state. Only gates whose rules name the user (or their groups, or someone they
    decide for): an inbox cannot probe other steps."""
    if not step_ids:
        return []
    gates = list(Step.objects.filter(pk__in=step_ids[:200], kind="approval")
                 .filter(pk__in=named_in_rules(user)).select_related("run").order_by("pk"))
    decided = briefs.decisions_by_gate(gates)
    for gate in gates:
        gate.decisions = briefs.approvals_of_attempt(decided.get(gate.pk, []), gate.attempt)[0]
        gate.mine = [d for d in gate.decisions if d.user_id == user.pk]
    return gates

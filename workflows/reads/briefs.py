"""A gate in words, for whoever reads it (the card, a mail, a chat message): the run's
params with their values, the trail of every step before the gate with the values written,
what approving and rejecting do, the decisions so far and the deadline; worked out for many
gates in a constant number of queries."""

from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q
from django.utils.timezone import now as timezone_now

from workflows.engine import deadline_then, signature_meaning
from workflows.engine.rules import condition_holds
from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    Decision,
    GateRule,
    Run,
    Step,
    StepStatus,
)
from workflows.people.permissions import who_decided
from workflows.specs.values import fill, readable

VALUE_CHARS = 80  # a value longer than this is shortened on the card, whole on demand


def short(value) -> tuple[str, str]:
    """(shortened text, whole text) of a value as a person reads it (values.readable; a
    value written as null says so)."""
    whole = readable(value, none="null")
    return (whole if len(whole) <= VALUE_CHARS else whole[:VALUE_CHARS - 1] + "…"), whole


def params_of(run: Run) -> list[dict]:
    """The run's params in the order the spec declares them, with their values."""
    found = []
    for param in run.spec.definition.get("params", []):
        if param["name"] in run.params:
            text, whole = short(run.params[param["name"]])
            found.append({"name": param.get("label") or param["name"], "value": text,
                          "whole": whole, "cut": text != whole})
    return found


def ancestors(key: str, by_key: dict[str, Step]) -> list[Step]:
    """Every step the gate waits on, directly or not, in the run's order."""
    seen, stack = set(), list(by_key[key].depends_on) if key in by_key else []
    while stack:
        dep = stack.pop()
        if dep in seen or dep not in by_key:
            continue
        seen.add(dep)
        stack.extend(by_key[dep].depends_on)
    return sorted((by_key[k] for k in seen), key=lambda step: step.index)


def trail_entry(step: Step, state: dict | None = None, by_key: dict | None = None) -> dict:
    """One step before the gate, in words, with the values it wrote: each as the run's
    shared state holds it now (what approvers decide on), and when something changed it
    since, what the step wrote and who changed it."""
    values = []
    for name, value in sorted((step.last_state_patch or {}).items()):
        now = state.get(name, value) if state is not None else value
        text, whole = short(now)
        entry = {"name": name, "value": text, "whole": whole, "cut": text != whole,
                 "was": "", "changed_by": ""}
        if now != value:
            entry["was"] = short(value)[0]
            entry["changed_by"] = next(
                (other.title for other in (by_key or {}).values() if other.pk != step.pk
                 and (other.last_state_patch or {}).get(name, object()) == now),
                "a report on the run")
        values.append(entry)
    summary = step.last_summary or ""
    if summary.endswith(" returned") or summary.endswith(" completed"):
        summary = ""  # a machine's "x.y.z returned": the status already says it
    return {"key": step.key, "title": step.title, "status": step.status,
            "finished_at": step.finished_at, "summary": summary,
            "reported_by": step.reported_by, "values": values,
            "child_run": step.child_run_id}


WHEN_WORDS = {"equals": "equals", "not_equals": "not equals", "in": "in", "exists": "exists",
              "gt": "is above", "gte": "is at least", "lt": "is below", "lte": "is at most"}


def consequences(gate: Step, by_key: dict[str, Step]) -> dict:
    """What approving starts (the steps right after the gate, with the condition any of them
    waits for) and what rejecting does (the run fails; the compensations it runs)."""
    starts = []
    for key in gate.dependents:
        step = by_key.get(key)
        if step is None:
            continue
        when = step.config.get("when")
        condition = ""
        if when:
            source = "params" if "params" in when else "state"
            path = f"{source} {when[source]}"
            test = next((t for t in WHEN_WORDS if t in when), "")
            condition = f"if {path} {WHEN_WORDS.get(test, test)} {json.dumps(when.get(test))}"
        starts.append({"title": step.title, "condition": condition})
    undone = [step.title for step in sorted(by_key.values(), key=lambda s: -s.index)
              if step.compensation and step.status == StepStatus.COMPLETED]
    return {"starts": starts, "undone": undone}


def brief(gates: list[Step]) -> None:
    """Give each gate `params`, `trail` and `consequences`, in one query for all their runs'
    steps."""
    if not gates:
        return
    steps: dict[int, dict[str, Step]] = {}
    for step in Step.objects.filter(run_id__in={gate.run_id for gate in gates}).only(
            "run_id", "key", "title", "index", "status", "depends_on", "dependents", "config",
            "compensation", "last_summary", "last_state_patch", "reported_by",
            "finished_at", "child_run_id").order_by("index"):
        steps.setdefault(step.run_id, {})[step.key] = step
    for gate in gates:
        by_key = steps.get(gate.run_id, {})
        gate.params = params_of(gate.run)
        state = gate.run.shared_state or {}
        gate.trail = [trail_entry(step, state, by_key) for step in ancestors(gate.key, by_key)]
        gate.consequences = consequences(gate, by_key)


def deadline(gate: Step, now) -> dict | None:
    """A gate's deadline for people: when, how long is left, and what happens then."""
    if gate.deadline_at is None:
        return None
    return {"at": gate.deadline_at, "left": (gate.deadline_at - now).total_seconds(),
            "then": deadline_then(gate)}


def due_gates(now, soon_seconds: float = 24 * 3600) -> list[dict]:
    """For managers, per group: the waiting gates that are overdue, due within a day, or
    escalated; in one query whatever their number."""
    gates = (Step.objects.filter(status=StepStatus.WAITING_APPROVAL,
                                 run__status__in=OPEN_RUN_STATUSES)
             .filter(Q(deadline_at__lte=now + timedelta(seconds=soon_seconds))
                     | Q(escalated_at__isnull=False))
             .select_related("run").order_by("approval_group", "deadline_at", "pk")[:1000])
    groups: dict[str, dict] = {}
    for gate in gates:
        gate.due = deadline(gate, now)
        entry = groups.setdefault(gate.approval_group, {
            "group": gate.approval_group, "overdue": [], "soon": [], "escalated": []})
        if gate.escalated_at:
            entry["escalated"].append(gate)
        if gate.due and gate.due["left"] < 0:
            entry["overdue"].append(gate)
        elif gate.due:
            entry["soon"].append(gate)
    return list(groups.values())


# How long gates have waited, in bands (seconds, the band's label).
WAIT_BANDS = ((3600, "under 1 h"), (4 * 3600, "1-4 h"), (86400, "4-24 h"),
              (3 * 86400, "1-3 days"), (7 * 86400, "3-7 days"), (None, "over 7 days"))


def waiting_distribution(now) -> dict:
    """For managers: per group, how many waiting gates have waited how long (WAIT_BANDS);
    one aggregate query whatever their number. {"bands": labels, "groups": [{"group",
    "counts", "total"}], "most": the largest count (the scale)}."""
    counts, lower = {}, None
    for i, (upper, _) in enumerate(WAIT_BANDS):
        band = Q()
        if upper is not None:
            band &= Q(waiting_since__gt=now - timedelta(seconds=upper))
        if lower is not None:
            band &= Q(waiting_since__lte=now - timedelta(seconds=lower))
        counts[f"band{i}"] = Count("pk", filter=band)
        lower = upper
    rows = (Step.objects.filter(status=StepStatus.WAITING_APPROVAL,
                                run__status__in=OPEN_RUN_STATUSES, waiting_since__isnull=False)
            .values("approval_group").annotate(**counts).order_by("approval_group"))
    groups = [{"group": row["approval_group"],
               "counts": [row[f"band{i}"] for i in range(len(WAIT_BANDS))]} for row in rows]
    labels = [label for _, label in WAIT_BANDS]
    for group in groups:
        group["total"] = sum(group["counts"])
        group["cells"] = list(zip(labels, group["counts"], strict=True))
    return {"bands": labels, "groups": groups,
            "most": max((c for g in groups for c in g["counts"]), default=0)}


OUTPUT_TAIL_LINES = 5


def fill_placeholders(text: str, run: Run) -> str:
    """`{{ state.key }}` and `{{ params.key }}` (dotted for nested values) from the run."""
    return fill(text, run.shared_state, run.params)


def approvals_of_attempt(decisions, attempt: int) -> tuple[list, int]:
    """(this attempt's decisions, how many of them approve): a gate's quorum progress."""
    current = [d for d in decisions if d.attempt == attempt]
    return current, sum(1 for d in current if d.decision == Decision.APPROVE)


def decisions_by_gate(gates: list) -> dict[int, list[Approval]]:
    """Every decision on these gates, oldest first, by gate id (one query)."""
    decided: dict[int, list[Approval]] = {}
    for approval in (Approval.objects.filter(step__in=[g.pk for g in gates])
                     .select_related("user", "on_behalf_of").order_by("at")):
        decided.setdefault(approval.step_id, []).append(approval)
    return decided


def rules_by_gate(gates: list) -> dict[int, list[GateRule]]:
    """The approval rules of each gate's current attempt, stage by stage (one query)."""
    wanted = Q(pk__in=[])
    for gate in gates:
        wanted |= Q(step_id=gate.pk, attempt=gate.attempt)
    found: dict[int, list[GateRule]] = {gate.pk: [] for gate in gates}
    for rule in GateRule.objects.filter(wanted).select_related("user").order_by(
            "step_id", "order", "position"):
        found[rule.step_id].append(rule)
    return found


def rules_not_applied(gate, rules) -> list[tuple[str, str]]:
    """(label, why) for each of the spec's rules that did not match this attempt."""
    spec = gate.config.get("approval", {}).get("rules") or []
    if not rules:
        return []
    matched = {rule.position for rule in rules}
    run = gate.run
    return [(rule.get("label", ""), condition_holds(rule["when"], run.shared_state or {},
                                                    run.params or {})[1])
            for position, rule in enumerate(spec) if position not in matched and "when" in rule]


def signature_to_give(gate) -> tuple[str, str]:
    """(what approving, what rejecting means) when the gate must be signed now: its first
    waiting rule that is signed, else the gate's own; ("", "") when it is not. Its rules
    read already (gate_evidence)."""
    for rule in [rule for rule in getattr(gate, "rules", []) if rule.open] or [None]:
        if meaning := signature_meaning(gate, rule):
            return meaning, signature_meaning(gate, rule, "reject")
    return "", ""


def page_only(gate) -> str:
    """Why only the gate's page can decide it ("" when a reply, a digest's press together
    or a notification's button can): they carry a decision and a comment, never a
    signature or a form's values. Its rules read already (gate_evidence)."""
    if signature_to_give(gate)[0]:
        return "it must be signed, which is done on its page"
    if gate.config.get("approval", {}).get("form"):
        return "its form is filled in on its page"
    return ""


def ways_to_sign() -> str:
    """How a person signs on a gate's page, as this deployment allows."""
    ways = ["your password", "a passkey"]
    if settings.TOLLGATE_OIDC_ISSUER:
        ways.append("signing in again at your company's sign-on")
    return ", ".join(ways[:-1]) + " or " + ways[-1]


def you_decided(verb: str, title: str, for_whom: str = "") -> str:
    """The line a person reads after deciding: "You approved Deploy for carol." when they
    decided as someone's delegate."""
    return f"You {verb} {title}{f' for {for_whom}' if for_whom else ''}."


def decided_people(decisions) -> set[int]:
    """Who has decided, among these loaded decisions of one attempt (permissions.who_decided)."""
    return who_decided([(d.user_id, d.on_behalf_of_id) for d in decisions])


def describe_rules(gate, rules) -> None:
    """What a page and a mail say of a gate's rules: `rules` (this attempt's, each with who
    `decided_by` it, from the gate's loaded `decisions`), `open_rules`, `waits_on` (whom it
    waits on now, in words) and `rules_not_applied` (with why)."""
    gate.rules = rules
    closed = gate.status != StepStatus.WAITING_APPROVAL  # decided, skipped or cancelled
    decided = [d for d in getattr(gate, "decisions", []) if d.attempt == gate.attempt]
    for rule in rules:  # who counted toward it ("bob", "erin for carol"), and where it stands
        rule.decided_by = [f"{d.user} for {d.on_behalf_of}" if d.on_behalf_of_id
                           else str(d.user) for d in decided if d.rule_id == rule.pk]
        rule.standing = ("met" if rule.met else "not met" if closed else "waiting"
                         if rule.open else "opens when the rules before it are met")
    gate.open_rules = [rule for rule in rules if rule.open]
    # A closed gate names every stage it had, not the first group of its spec.
    audiences = rules if closed else gate.open_rules
    gate.waits_on = (", ".join(dict.fromkeys(rule.audience for rule in audiences))
                     or gate.approval_group)
    gate.rules_not_applied = rules_not_applied(gate, rules)


def output_of(step: Step) -> dict:
    """A step's output for a card: the last lines, and the whole of it when that was cut."""
    output = (step.last_evidence or {}).get("stdout", "") or ""
    lines = output.rstrip("\n").splitlines()
    return {"tail": "\n".join(lines[-OUTPUT_TAIL_LINES:]), "output": output,
            "cut": len(lines) > OUTPUT_TAIL_LINES}


def gate_evidence(gates: list, *, rules: dict[int, list[GateRule]] | None = None) -> list:
    """Give each gate what its approvers decide with, in five queries whatever the count:
    `instructions`, `decisions` (this attempt's, for quorum progress) and their
    `version`, `rules` (which apply to this run, which are met), `due` (the deadline in
    words), and the brief (brief: params, the trail of steps before it, each direct
    dependency's output, consequences). `rules`: each gate's, where they were read."""
    if not gates:
        return gates
    wanted = Q(pk__in=[])
    for gate in gates:
        wanted |= Q(run_id=gate.run_id, key__in=gate.depends_on)
    outputs = {(s.run_id, s.key): output_of(s) for s in Step.objects.filter(wanted).only(
        "run_id", "key", "last_evidence")}
    decided = decisions_by_gate(gates)
    rules = rules_by_gate(gates) if rules is None else rules
    brief(gates)
    now = timezone_now()
    for gate in gates:
        gate.instructions = fill_placeholders(gate.config.get("description", ""), gate.run)
        gate.decisions, gate.approved = approvals_of_attempt(decided.get(gate.pk, []),
                                                             gate.attempt)
        describe_rules(gate, rules[gate.pk])
        # What the live inbox compares to know a card's quorum line changed.
        gate.version = f"{gate.attempt}.{len(gate.decisions)}"
        gate.due = deadline(gate, now)
        for entry in gate.trail:
            entry["output"] = (outputs.get((gate.run_id, entry["key"]))
                               if entry["key"] in gate.depends_on else None)
    return gates

"""The managers' progress report for a goal subtree or for everything, in constant queries."""

from __future__ import annotations

import statistics
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta

from django.db.models import (
    Case,
    Count,
    Exists,
    IntegerField,
    OuterRef,
    Q,
    Sum,
    Value,
    When,
)
from django.utils import timezone

from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    GateRule,
    Run,
    RunDay,
    RunStatus,
    Step,
    StepStatus,
)
from workflows.people.permissions import readable_runs, sees_every_run
from workflows.timing.timezones import day_starts

from .models import Goal, GoalLink, GoalStatus

WEEKS = 12
LATENCY_DAYS = 90

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Latency:
    group: str
    decisions: int
    median: float
    p90: float


@dataclass
class SpecFailures:
    spec: str
    finished: int
    failed: int

    @property
    def rate(self) -> float:
        return self.failed / self.finished if self.finished else 0.0


@dataclass
class Report:
    root: Goal | None
    goals_by_status: dict[str, int]
    weeks: list[tuple[datetime, int]]
    gates: list[Step]
    latencies: list[Latency]
    failures: list[SpecFailures]
    blocked: list[Goal]
    generated_at: datetime = field(default_factory=timezone.now)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """The report as (section, item, measure, value) rows, for the CSV export."""
        rows = [("goals by status", s, "goals", str(n)) for s, n in self.goals_by_status.items()]
        rows += [("runs completed per week", f"{week:%Y-%m-%d}", "runs", str(n))
                 for week, n in self.weeks]
        now = self.generated_at
        rows += [("gates waiting", f"run {g.run_id} {g.key}", "waiting seconds",
                  f"{(now - g.waiting_since).total_seconds():.0f}") for g in self.gates]
        for item in self.latencies:
            rows += [("approval latency", item.group, "decisions", str(item.decisions)),
                     ("approval latency", item.group, "median seconds", f"{item.median:.1f}"),
                     ("approval latency", item.group, "p90 seconds", f"{item.p90:.1f}")]
        for item in self.failures:
            rows += [("failure rate", item.spec, "finished runs", str(item.finished)),
                     ("failure rate", item.spec, "failed runs", str(item.failed)),
                     ("failure rate", item.spec, "rate", f"{item.rate:.3f}")]
        rows += [("blocked goals", g.title, "blocker", g.blocker_reason) for g in self.blocked]
        return rows


def progress_report(root: Goal | None = None, now: datetime | None = None, *,
                    user=None) -> Report:
    """Goals by status, weekly completions, waiting gates, latency, failure rates, blockers.
    Counts are of every run; the waiting gates listed are of the runs `user` may read
    (TOLLGATE_RUN_VISIBILITY), all of them when no user is given."""
    now = now or timezone.now()
    goals, runs, steps, approvals, days = (Goal.objects.all(), Run.objects.all(),
                                           Step.objects.all(), Approval.objects.all(),
                                           RunDay.objects.all())
    by_status = dict.fromkeys(GoalStatus.values, 0)
    if root is not None:
        # The subtree from the closure, as a subquery each query looks its goals up in.
        subtree = GoalLink.subtree(root.pk)
        goals = goals.filter(pk__in=subtree)
        runs = runs.filter(goal_id__in=subtree)
        days = days.filter(goal_id__in=subtree)
        # Few gates wait and few decisions are recent: those are read first and looked up
        # in the subtree (as EXISTS), not the subtree's every run searched for them.
        steps = steps.filter(Exists(GoalLink.objects.filter(
            ancestor_id=root.pk, descendant_id=OuterRef("run__goal_id"))))
        approvals = approvals.filter(Exists(GoalLink.objects.filter(
            ancestor_id=root.pk, descendant_id=OuterRef("step__run__goal_id"))))
    by_status.update(goals.values_list("status").annotate(n=Count("pk")).order_by())

    weeks = _weeks(now, runs, days)

    # Gates wait only in open runs; saying so lets the planner start from those runs.
    waiting = steps.filter(status=StepStatus.WAITING_APPROVAL,
                           run__status__in=OPEN_RUN_STATUSES)
    if user is not None and not sees_every_run(user):
        waiting = waiting.filter(run__in=readable_runs(user))
    # What the list shows: a gate's evidence and a run's parameters stay unread.
    gates = list(waiting.select_related("run").only(
        "key", "title", "approval_group", "waiting_since", "run__title", "run__spec_name")
        .order_by("waiting_since", "pk")[:100])
    _name_people_waited_on(gates)

    waits: dict[str, list[float]] = {}
    for group, seconds in approvals.filter(
            at__gte=now - timedelta(days=LATENCY_DAYS), waited_seconds__isnull=False
    ).values_list("group", "waited_seconds"):
        waits.setdefault(group, []).append(seconds)
    latencies = [Latency(group, len(v), statistics.median(v), percentile(v, 90))
                 for group, v in sorted(waits.items())]

    failures = [
        SpecFailures(spec, completed + failed, failed) for spec, completed, failed in
        days.values_list("spec_name").annotate(completed=Sum("completed"), failed=Sum("failed"))
        .order_by("spec_name") if completed or failed
    ]
    blocked = list(goals.filter(status=GoalStatus.BLOCKED).select_related("owner")
                   .order_by("title")[:100])
    return Report(root, by_status, weeks, gates, latencies, failures, blocked, now)


def _name_people_waited_on(gates: list) -> None:
    """`waits_on` for each gate: its group, or (one query for all) the people its open rules
    name, with why them ("dave (alice's manager)")."""
    people = {}
    waiting_on_people = [gate.pk for gate in gates if not gate.approval_group]
    if waiting_on_people:
        for rule in (GateRule.objects.filter(step_id__in=waiting_on_people, open=True,
                                              user__isnull=False).select_related("user")):
            people.setdefault(rule.step_id, []).append(rule.audience)
    for gate in gates:
        gate.waits_on = gate.approval_group or ", ".join(people.get(gate.pk, []))


def _weeks(now: datetime, runs, days) -> list[tuple[datetime, int]]:
    """Runs completed in each of the viewer's last WEEKS weeks (Monday to Monday in their
    time zone): the UTC days wholly inside a week summed from the day rows (RunDay), and the
    UTC days a week starts in (when the viewer's midnight is not UTC's) counted exactly from
    the runs, in one query each, whatever the number of runs."""
    monday = timezone.localtime(now).date()
    monday -= timedelta(days=monday.weekday())
    starts = [day_starts(monday - timedelta(weeks=WEEKS - 1 - i)) for i in range(WEEKS + 1)]
    edges = sorted({start.astimezone(UTC).date() for start in starts
                    if start.astimezone(UTC).time() != time()})
    counted = [0] * WEEKS
    for day, n in (days.filter(day__gte=starts[0].astimezone(UTC).date(),
                               day__lte=starts[-1].astimezone(UTC).date())
                   .exclude(day__in=edges).values_list("day")
                   .annotate(n=Sum("completed")).order_by()):
        week = bisect_right(starts, datetime.combine(day, time(), UTC)) - 1
        if 0 <= week < WEEKS:
            counted[week] += n
    if edges:
        # As ranges of instants: no function of each run's time (SQLite would call Python).
        within = Q()
        for day in edges:
            midnight = datetime.combine(day, time(), UTC)
            within |= Q(finished_at__gte=midnight, finished_at__lt=midnight + timedelta(days=1))
        week = Case(*(When(finished_at__gte=starts[i], then=Value(i))
                      for i in reversed(range(WEEKS))), output_field=IntegerField())
        for index, n in (runs.filter(within, status=RunStatus.COMPLETED,
                                     finished_at__gte=starts[0], finished_at__lt=starts[-1])
                         .values_list(week).annotate(n=Count("pk")).order_by()):
            counted[index] += n
    return [(starts[i], counted[i]) for i in range(WEEKS)]

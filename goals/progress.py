"""The managers' progress report for a goal subtree or for everything, in constant queries."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Case, Count, IntegerField, Q, Value, When
from django.utils import timezone

from workflows.models import OPEN_RUN_STATUSES, Approval, Run, RunStatus, Step, StepStatus
from workflows.permissions import readable_runs, sees_every_run
from workflows.timezones import day_starts

from . import tree
from .models import Goal, GoalStatus

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
    goals, runs, steps, approvals = (Goal.objects.all(), Run.objects.all(), Step.objects.all(),
                                     Approval.objects.all())
    by_status = dict.fromkeys(GoalStatus.values, 0)
    if root is not None:
        # The subtree is walked once; the other queries look its ids up.
        members = tree.subtree_by(root.pk, "status")
        by_status.update((status, len(ids)) for status, ids in members.items())
        subtree = tree.among([pk for ids in members.values() for pk in ids])
        goals = goals.filter(pk__in=tree.among(members.get(GoalStatus.BLOCKED, [])))
        runs = runs.filter(goal_id__in=subtree)
        steps = steps.filter(run__goal_id__in=subtree)
        approvals = approvals.filter(step__run__goal_id__in=subtree)
    else:
        by_status.update(goals.values_list("status").annotate(n=Count("pk")).order_by())

    # The viewer's weeks (Monday to Monday in their time zone) as instants, counted as
    # ranges in one query: no function of each run's time, which SQLite would call in Python.
    monday = timezone.localtime(now).date()
    monday -= timedelta(days=monday.weekday())
    starts = [day_starts(monday - timedelta(weeks=WEEKS - 1 - i)) for i in range(WEEKS + 1)]
    week = Case(*(When(finished_at__gte=starts[i], then=Value(i))
                  for i in reversed(range(WEEKS))), output_field=IntegerField())
    counted = dict(runs.filter(status=RunStatus.COMPLETED, finished_at__gte=starts[0],
                               finished_at__lt=starts[-1])
                   .values_list(week).annotate(n=Count("pk")).order_by())
    weeks = [(starts[i], counted.get(i, 0)) for i in range(WEEKS)]

    # Gates wait only in open runs; saying so lets the planner start from those runs.
    waiting = steps.filter(status=StepStatus.WAITING_APPROVAL,
                           run__status__in=OPEN_RUN_STATUSES)
    if user is not None and not sees_every_run(user):
        waiting = waiting.filter(run__in=readable_runs(user))
    gates = list(waiting
                 .select_related("run").order_by("waiting_since", "pk")[:100])

    waits: dict[str, list[float]] = {}
    for group, seconds in approvals.filter(
            at__gte=now - timedelta(days=LATENCY_DAYS), waited_seconds__isnull=False
    ).values_list("group", "waited_seconds"):
        waits.setdefault(group, []).append(seconds)
    latencies = [Latency(group, len(v), statistics.median(v), percentile(v, 90))
                 for group, v in sorted(waits.items())]

    failures = [
        SpecFailures(spec, finished, failed) for spec, finished, failed in
        runs.filter(status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
        .values_list("spec_name")
        .annotate(finished=Count("pk"), failed=Count("pk", filter=Q(status=RunStatus.FAILED)))
        .order_by("spec_name")
    ]
    blocked = list(goals.filter(status=GoalStatus.BLOCKED).select_related("owner")
                   .order_by("title")[:100])
    return Report(root, by_status, weeks, gates, latencies, failures, blocked, now)

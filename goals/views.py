"""The goal tree and goal pages; rollups come from one recursive query per page."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from tollgate.exports import csv_rows
from tollgate.query import int_param
from workflows.models import Run
from workflows.people.permissions import readable_runs

from .models import Goal, GoalStatus
from .progress import progress_report
from .rollup import family_rollups, rollups
from .tree import ancestor_ids


def _with_rollups(goals: list[Goal]) -> list[Goal]:
    sums = rollups(g.pk for g in goals)
    for goal in goals:
        goal.rollup = sums[goal.pk]
    return goals


def _with_family_rollups(goal: Goal, children: list[Goal]) -> None:
    sums = family_rollups(goal.pk, [child.pk for child in children])
    for item in (goal, *children):
        item.rollup = sums[item.pk]


@require_GET
def goal_tree(request):
    goals = Goal.objects.select_related("owner").order_by("title", "pk")
    status, owner = request.GET.get("status", ""), int_param(request.GET, "owner")
    filtered = status in GoalStatus.values or owner is not None
    if status in GoalStatus.values:
        goals = goals.filter(status=status)
    if owner is not None:
        goals = goals.filter(owner_id=owner)
    if not filtered:
        goals = goals.filter(parent__isnull=True)
    owners = get_user_model().objects.filter(owned_goals__isnull=False).distinct().order_by(
        "username")
    return render(request, "goals/goal_tree.html", {
        "goals": _with_rollups(list(goals[:500])), "filtered": filtered,
        "statuses": GoalStatus.choices, "owners": owners,
        "filters": {"status": status, "owner": "" if owner is None else str(owner)},
    })


@require_GET
def goal_children(request, pk: int):
    """The goal's row, opened, followed by its children's rows (it replaces the closed row)."""
    goal = get_object_or_404(Goal.objects.select_related("owner", "opened_by"), pk=pk)
    children = list(goal.children.select_related("owner").order_by("title", "pk"))
    _with_family_rollups(goal, children)
    depth = int_param(request.GET, "depth", 1, maximum=100) or 1
    goal.expanded = True
    for item, level in [(goal, depth - 1), *((child, depth) for child in children)]:
        item.depth, item.indent = level, min(level, MAX_INDENT)
    return render(request, "goals/goal_tree.html#goal-rows", {"goals": [goal, *children]})


MAX_INDENT = 8  # deeper goals line up at this indent (app.css has .indent-0 to .indent-8)


@require_GET
def goal_detail(request, pk: int):
    goal = get_object_or_404(Goal.objects.select_related("owner", "parent"), pk=pk)
    chain = ancestor_ids(pk)[1:]
    ancestors = Goal.objects.in_bulk(chain)
    children = list(goal.children.select_related("owner").order_by("title", "pk"))
    _with_family_rollups(goal, children)
    runs = list(readable_runs(request.user, Run.objects.filter(goal=goal))
                .select_related("spec", "requested_by").order_by("-created_at", "-id")[:50])
    return render(request, "goals/goal_detail.html", {
        "goal": goal,
        "breadcrumbs": [ancestors[i] for i in reversed(chain) if i in ancestors],
        "children": children, "runs": runs,
    })


def _bars(pairs, width: int = 240) -> list[dict]:
    """Label, value and bar width (px) for a server-rendered SVG bar chart."""
    top = max((v for _, v in pairs), default=0) or 1
    return [{"label": label, "value": value, "width": round(width * value / top)}
            for label, value in pairs]


@require_GET
def progress(request, pk: int | None = None):
    from django.http import HttpResponse

    root = get_object_or_404(Goal, pk=pk) if pk is not None else None
    report = progress_report(root, user=request.user)
    if request.GET.get("format") == "csv":
        response = HttpResponse(csv_rows(report.rows(), ["section", "item", "measure", "value"]),
                                content_type="text/csv")
        name = f"progress-goal-{root.pk}" if root else "progress"
        response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
        return response
    return render(request, "goals/progress.html", {
        "report": report, "root": root,
        "status_bars": _bars(list(report.goals_by_status.items())),
        "week_bars": _bars([(f"{w:%d %b}", n) for w, n in report.weeks], width=160),
        "latency_bars": _bars([(item.group, item.p90) for item in report.latencies]),
    })

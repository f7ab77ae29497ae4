"""Pages at 10k goals, 100k runs, 1M checkpoints: median time and query counts."""

from __future__ import annotations

import time

from bench.plumbing import analyze, gate_spec, search_plan
from tests.support.stats import summary


def measure(bench) -> None:
    """Server time and queries of each page at a small size and at production size
    (full: 10k goals, 100k runs, 1M checkpoints); the query counts must not move."""
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client

    from bench import data
    from workflows.timing import clock

    viewer, _ = User.objects.get_or_create(username="bench-viewer")
    viewer.groups.add(Group.objects.get_or_create(name="bench-qa")[0])
    client = Client()
    client.force_login(viewer)

    def measure(url, n=20):
        queries = []

        def count(execute, sql, params, many, context):
            queries.append(sql)
            return execute(sql, params, many, context)

        clock.defer_measuring()  # its once-a-minute query is no page's
        with connection.execute_wrapper(count):
            assert client.get(url).status_code == 200, url
        times = []
        for _ in range(n):
            started = time.perf_counter()
            client.get(url)
            times.append((time.perf_counter() - started) * 1e3)
        return {"queries": len(queries), **summary(times)}

    def all_pages(root, run, n=20):
        return {"inbox": measure("/", n), "goal_tree": measure("/goals/", n),
                "goal_page": measure(f"/goals/{root.pk}/", n),
                "progress": measure(f"/goals/{root.pk}/progress/", max(n // 2, 3)),
                "run_page": measure(f"/runs/{run.pk}/", n),
                "run_search": measure("/runs/?q=bench+run&opened_from=2000-01-01", n),
                "run_search_rare": measure("/runs/?q=needle", n)}

    spec = gate_spec()
    goals, runs, per_run, timeline = bench.pick((1_000, 2_000, 10, 200),
                                               (10_000, 10_000, 10, 2_000),
                                               (10_000, 100_000, 10, 20_000))
    floor = measure("/healthz", 50)
    small_root, small_leaves = data.grow_goals(100)
    data.grow_runs(spec, viewer, 200, per_run, small_leaves)
    small_run = data.grow_timeline(spec, 20)
    analyze()
    small = all_pages(small_root, small_run)
    started = time.perf_counter()
    big_root, big_leaves = data.grow_goals(goals)
    written = data.grow_runs(spec, viewer, runs, per_run, big_leaves)
    big_run = data.grow_timeline(spec, timeline)
    grown_s = time.perf_counter() - started
    analyze()
    big = all_pages(big_root, big_run, 10)
    from goals.models import Goal, GoalLink
    from goals.rollup import rollup
    from workflows.models import Checkpoint, Run, RunStatus

    # The goal pages read tallies: they must add up to the runs they stand for.
    completed = Run.objects.filter(goal_id__in=GoalLink.subtree(big_root.pk),
                                   status=RunStatus.COMPLETED).count()
    from goals.progress import progress_report

    weekly = sum(n for _, n in progress_report(big_root).weeks)
    bench.results["pages"] = {
        "rollup_matches_runs": rollup(big_root.pk).runs_completed == completed,
        "progress_matches_runs": weekly == completed,
        "goals": Goal.objects.count(), "runs": Run.objects.count(),
        "checkpoints": Checkpoint.objects.count(), "checkpoints_written": written,
        "run_page_checkpoints": timeline, "seconds_to_write_data": grown_s,
        "floor_healthz": floor, "small": small, "large": big,
        "target_median_ms": 50,
        "queries_independent_of_size": all(
            small[k]["queries"] == big[k]["queries"] for k in small),
        "ratio_to_floor": {k: v["median"] / floor["median"] for k, v in big.items()},
        "search_plan": search_plan()}

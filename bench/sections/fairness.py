"""A short run beside a 5,000-step fan-out: how long it waits for a worker."""

from __future__ import annotations

import time

from tests.support.stats import summary


def measure(bench) -> None:
    """With a 5,000-step fan-out in flight, how soon a new 3-step run starts and ends."""
    from workflows import engine
    from workflows.models import Run, Step
    from workflows.specs.storage import store_spec

    width, probes = bench.pick((100, 2), (1000, 5), (5000, 10))
    noop = {"callable": "workflows.callables.noop"}
    big = store_spec({"name": "bench-backlog", "steps": [
        {"key": f"s{i}", "run": noop} for i in range(width)]})[0]
    small = store_spec({"name": "bench-small", "steps": [
        {"key": f"s{i}", "run": noop, **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(3)]})[0]

    def in_flight(run_id) -> bool:
        return Run.objects.filter(pk=run_id, status__in=("open", "running")).exists()

    backlog = engine.open_run(big).run.pk
    while Step.objects.filter(run_id=backlog, status="completed").count() < width // 20:
        time.sleep(0.01)
    starts, ends, backlog_done = [], [], []
    for _ in range(probes):
        if not in_flight(backlog):
            backlog = engine.open_run(big).run.pk
            time.sleep(0.2)
        run = engine.open_run(small).run
        deadline = time.perf_counter() + 60
        while Run.objects.filter(pk=run.pk).values_list("status", flat=True)[0] != \
                "completed":
            if time.perf_counter() > deadline:
                raise RuntimeError("the small run did not finish beside the backlog")
            time.sleep(0.005)
        run.refresh_from_db()
        first = Step.objects.get(run=run, key="s0").started_at
        starts.append((first - run.created_at).total_seconds() * 1e3)
        ends.append((run.finished_at - run.created_at).total_seconds() * 1e3)
        backlog_done.append(in_flight(backlog))
        time.sleep(0.1)
    bench.results["fairness"] = {
        "backlog_steps": width, "probes": probes,
        "backlog_in_flight_at_each_probe": backlog_done,
        "first_step_started_ms": summary(starts), "completed_ms": summary(ends),
        "target_first_step_median_ms": 200, "target_completed_median_ms": 1000}
    try:
        engine.cancel_run(backlog, reason="benchmark over")
    except engine.IllegalTransition:
        pass  # it finished on its own meanwhile: nothing left to stop

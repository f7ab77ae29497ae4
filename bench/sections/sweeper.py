"""The sweeper and the deadline task as the table grows tenfold."""

from __future__ import annotations

import time


def measure(bench) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import Run, Step
    from workflows.recovery import sweeper
    from workflows.specs.storage import store_spec

    spec = store_spec({"name": "bench-sweep", "steps": [
        {"key": f"s{i}", "run": {"callable": "workflows.callables.noop"}}
        for i in range(100)]})[0]
    per_run = 100

    def add_steps(total: int, expired: int, per_run: int = per_run,
                  dead_per_run: int = per_run) -> None:
        holding = -(-expired // dead_per_run)  # runs that hold an expired lease
        runs = Run.objects.bulk_create(
            Run(spec=spec, spec_name=spec.name, title="sweep",
                status="running" if i < holding else "completed")
            for i in range(total // per_run))
        now = timezone.now()
        steps = []
        for r_index, run in enumerate(runs):
            for i in range(per_run):
                dead = i < dead_per_run and r_index * dead_per_run + i < expired
                steps.append(Step(
                    run=run, key=f"s{i}", index=i, kind="run", config={"key": f"s{i}"},
                    status="running" if dead else "completed", attempt=1,
                    lease_token="t" if dead else "", lease_owner="gone" if dead else "",
                    lease_expires_at=now - timedelta(seconds=60) if dead else None))
        Step.objects.bulk_create(steps, batch_size=5000)

    def timed_sweep() -> dict:
        """Sweeps until the 1,000 dead leases are reclaimed (one sweep should do; on a
        loaded machine a lease may not look dead to the first): seconds and sweeps."""
        started, sweeps, expired = time.perf_counter(), 0, 0
        while expired < 1000 and sweeps < 10:
            report = sweeper.sweep(limit=5000)
            sweeps += 1
            expired += report.expired
        return {"s": time.perf_counter() - started, "sweeps": sweeps, "expired": expired}

    def timed_scan() -> float:
        started = time.perf_counter()
        ids = sweeper.expired_leases(timezone.now(), 5000)
        seconds = time.perf_counter() - started
        if len(ids) != 1000:
            raise RuntimeError(f"the scan found {len(ids)} expired leases, not 1000")
        return seconds

    def timed_deadlines(count: int) -> float:
        """`count` gates past their deadline (the deadline task rejects them)."""
        gates = list(Step.objects.filter(kind="approval", status="waiting_approval",
                                         run__spec_name="bench-deadline")[:count])
        for _ in range(count - len(gates)):
            gates.append(Step.objects.get(run=engine.open_run(deadline_spec).run,
                                          key="gate"))
        Step.objects.filter(pk__in=[g.pk for g in gates]).update(
            deadline_at=timezone.now() - timedelta(seconds=1))
        started = time.perf_counter()
        done = deadlines.apply(limit=5000)
        seconds = time.perf_counter() - started
        if done != count:
            raise RuntimeError(f"the deadline task expired {done} gates, not {count}")
        return seconds

    from django.contrib.auth.models import Group

    from workflows import engine
    from workflows.timing import deadlines

    Group.objects.get_or_create(name="bench-qa")
    deadline_spec = store_spec({"name": "bench-deadline", "steps": [
        {"key": "gate", "approval": {"group": "bench-qa", "timeout_seconds": 3600}}]})[0]
    n = bench.pick(2_000, 20_000, 50_000)
    add_steps(n, 1000)
    scan_1, sweep_1, due_1 = timed_scan(), timed_sweep(), timed_deadlines(200)
    add_steps(9 * n, 1000)  # the table grows tenfold; 1,000 leases expire again
    scan_2, sweep_2, due_2 = timed_scan(), timed_sweep(), timed_deadlines(200)
    # The worst case for the sweeper: each dead lease in a run of its own.
    add_steps(10_000, 1000, per_run=10, dead_per_run=1)
    sweep_spread = timed_sweep()
    txn = bench.floor_transaction_pair(1000) * 1000
    bench.results["sweeper"] = {
        "steps_before": n, "steps_after": 10 * n, "expired_each_time": 1000,
        "scan_ms": [scan_1 * 1e3, scan_2 * 1e3], "sweeps": [sweep_1, sweep_2],
        "sweep_s": [sweep_1["s"], sweep_2["s"]], "sweep_one_per_run": sweep_spread,
        "sweep_one_per_run_s": sweep_spread["s"], "target_s": 2,
        "growth_when_table_grows_tenfold": sweep_2["s"] / sweep_1["s"],
        "scan_growth_when_table_grows_tenfold": scan_2 / scan_1,
        "deadlines_200_gates_s": [due_1, due_2],
        "deadline_growth_when_table_grows_tenfold": due_2 / due_1,
        "floor_1000_transaction_pairs_s": txn, "ratio_to_floor": sweep_2["s"] / txn}

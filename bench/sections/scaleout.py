"""Many consumers (PostgreSQL): steps per second beside the raw write ceiling and DBOS's
queue, with CPU and write transactions per step."""

from __future__ import annotations

import os
import time

from bench.peers import dbos_peer
from bench.plumbing import PG_URL, chain_spec, timezone_now


def measure(bench) -> None:
    """Many short runs on 1, 2 and 4 consumers: steps per second beside the same number
    of raw clients' write ceiling and DBOS's queue, with where the CPU went; with group
    commits of up to 8 steps (the default), and at 2 x 2 one step per transaction."""
    if bench.backend != "postgres":
        bench.results["scaleout"] = {"skipped": "PostgreSQL only: SQLite takes one writer "
                                               "at a time"}
        return
    from django.db import connection, transaction

    from bench import scale
    from workflows import engine
    from workflows.models import Run, Step

    runs_n, length = bench.pick((30, 5), (150, 5), (300, 5))
    topologies = bench.pick([(1, 2, 8), (2, 2, 8), (2, 2, 1)],
                            [(1, 2, 8), (2, 2, 8), (4, 2, 8), (2, 2, 1)],
                            [(1, 2, 8), (1, 4, 8), (2, 2, 8), (4, 2, 8), (2, 2, 1)])
    spec = chain_spec("bench-scale", length)
    url = PG_URL.replace("postgres://", "postgresql://")
    database = connection.settings_dict["NAME"]

    def next_xid() -> int:
        """The next transaction id: PostgreSQL gives one to each transaction that writes,
        so the difference counts write transactions (reads take none)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            return cursor.fetchone()[0]

    rows = []
    for consumers, threads, group in topologies:
        bench.start_consumers(consumers, threads,
                              env={"TOLLGATE_GROUP_COMMIT_STEPS": str(group)})
        time.sleep(2)  # every consumer up and idle
        cpu = (scale.cpu_seconds(p.pid for p in bench.consumers),
               scale.cpu_seconds(scale.postgres_pids()))
        before = next_xid()
        with transaction.atomic():  # every run opens at once: the doorbells ring together
            ids = [engine.open_run(spec).run.pk for _ in range(runs_n)]
        opened = timezone_now()
        with scale.ActivitySampler(url, database) as activity:
            deadline = time.perf_counter() + 600
            while Run.objects.filter(pk__in=ids).exclude(status="completed").exists():
                if time.perf_counter() > deadline:
                    raise RuntimeError("the scale-out runs did not finish")
                time.sleep(0.05)
        used = (scale.cpu_seconds(p.pid for p in bench.consumers) - cpu[0],
                scale.cpu_seconds(scale.postgres_pids()) - cpu[1])
        finished = list(Step.objects.filter(run_id__in=ids).values_list("finished_at",
                                                                       flat=True))
        seconds = (max(finished) - opened).total_seconds()
        steps = len(finished)
        written = next_xid() - before - 1  # less the opening's transaction
        bench.stop_consumers()
        ceiling = scale.ceiling(url, consumers * threads)
        rate = steps / seconds
        rows.append({
            "consumers": consumers, "threads": threads, "group_commit_steps": group,
            "steps": steps,
            "steps_per_s": rate, "steady_steps_per_s": scale.steady_rate(finished),
            "raw_ceiling_tps": ceiling, "fraction_of_ceiling": rate / ceiling,
            "consumer_cpu_ms_per_step": used[0] / steps * 1e3,
            "postgres_cpu_ms_per_step": used[1] / steps * 1e3,
            "cpu_busy_share": (used[0] + used[1]) / (seconds * (os.cpu_count() or 1)),
            "write_transactions_per_step": written / steps,
            "backends": activity.shares()})
    peer = dbos_peer(bench.backend, "queue", runs_n, length)
    bench.results["scaleout"] = {
        "workload": f"{runs_n} runs x {length} no-op steps, opened at once",
        "rows": rows, "dbos_queue": peer, "target_fraction_of_ceiling": 0.5}

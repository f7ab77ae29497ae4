"""The DBOS peer for `make bench`, on SQLite or PostgreSQL, in whichever interpreter has dbos
(run as a subprocess): `python dbos_peer.py DATABASE_URL WORKLOAD N [M]` prints one JSON line.

Workloads, each checkpointed by DBOS (a step output row per step, a status row per workflow):
- `linear N`: one workflow of N no-op steps; ms per step;
- `fanout N`: N one-step workflows started at once (DBOS's way to run steps in parallel);
  steps per second;
- `runs N M`: N workflows of M no-op steps each, started at once; steps per second;
- `queue N M`: the same N workflows put on a DBOS queue (its way to spread work over
  workers) at once; steps per second.
"""

from __future__ import annotations

import json
import logging
import sys
import time


def main() -> None:
    try:  # a recent SQLite for DBOS's schema (3.42+) where the interpreter links an older one
        import pysqlite3

        sys.modules["sqlite3"] = pysqlite3
    except ImportError:
        pass
    url, workload, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config={"name": "tollgate-bench-peer", "system_database_url": url})

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def chain(count: int) -> int:
        for i in range(count):
            noop(i)
        return count

    @DBOS.workflow()
    def one(i: int) -> int:
        return noop(i)

    DBOS.launch()
    # Polled every 0.1 s (not its default 1 s), so that the queue's throughput is not its
    # polling interval's.
    queue = DBOS.register_queue("bench-queue", polling_interval_sec=0.1) \
        if workload == "queue" else None
    chain(5)  # warm: connections, schema
    started = time.perf_counter()
    if workload == "linear":
        chain(n)
        elapsed = time.perf_counter() - started
        result = {"per_step_ms": elapsed / n * 1e3, "steps": n}
    elif workload == "fanout":
        for handle in [DBOS.start_workflow(one, i) for i in range(n)]:
            handle.get_result()
        elapsed = time.perf_counter() - started
        result = {"steps_per_s": n / elapsed, "steps": n}
    elif workload == "runs":
        for handle in [DBOS.start_workflow(chain, m) for _ in range(n)]:
            handle.get_result()
        elapsed = time.perf_counter() - started
        result = {"steps_per_s": n * m / elapsed, "steps": n * m}
    elif workload == "queue":
        for handle in [queue.enqueue(chain, m) for _ in range(n)]:
            handle.get_result()
        elapsed = time.perf_counter() - started
        result = {"steps_per_s": n * m / elapsed, "steps": n * m}
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    print(json.dumps(result))
    DBOS.destroy()


if __name__ == "__main__":
    main()

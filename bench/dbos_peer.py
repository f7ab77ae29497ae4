"""The DBOS peer for `make bench`: a linear workflow of N no-op steps, each checkpointed by
DBOS (one step output row per step), on SQLite or PostgreSQL. Run as a subprocess in
whichever interpreter has dbos: `python dbos_peer.py DATABASE_URL STEPS` prints ms per step."""

from __future__ import annotations

import logging
import sys
import time


def main() -> None:
    url, steps = sys.argv[1], int(sys.argv[2])
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config={"name": "tollgate-bench-peer", "system_database_url": url})

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def chain(n: int) -> int:
        for i in range(n):
            noop(i)
        return n

    DBOS.launch()
    chain(5)  # warm
    started = time.perf_counter()
    chain(steps)
    print(f"{(time.perf_counter() - started) / steps * 1e3:.4f}")
    DBOS.destroy()


if __name__ == "__main__":
    main()

"""What the scale-out section measures beside Tollgate: the database's raw write ceiling for a
number of clients, the CPU each side spends, and what the PostgreSQL backends are doing.

`python bench/scale.py CLIENT URL ROW SECONDS` is one ceiling client (run as a process of its
own, so clients do not share an interpreter): it commits an UPDATE of its own row and an
INSERT, as a step's transition does at its smallest, for SECONDS and prints the count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def ceiling(url: str, clients: int, seconds: float = 3.0) -> float:
    """Transactions per second `clients` processes commit together, each an UPDATE of its
    own row and an INSERT (the same durability as a transition)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling_row (id int PRIMARY KEY, "
                     "n bigint NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling_log (id int NOT NULL, "
                     "seq bigint NOT NULL, note varchar(100) NOT NULL)")
        conn.execute("TRUNCATE bench_ceiling_row, bench_ceiling_log")
        conn.execute("INSERT INTO bench_ceiling_row SELECT g, 0 FROM generate_series(1, %s) g",
                     [clients])
    procs = [subprocess.Popen([sys.executable, __file__, "client", url, str(row), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
             for row in range(1, clients + 1)]
    counts = [int(proc.communicate(timeout=seconds + 60)[0].strip() or 0) for proc in procs]
    return sum(counts) / seconds


def _client(url: str, row: int, seconds: float) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        done, stop = 0, time.perf_counter() + seconds
        while time.perf_counter() < stop:
            with conn.transaction():
                conn.execute("UPDATE bench_ceiling_row SET n = n + 1 WHERE id = %s", [row])
                conn.execute("INSERT INTO bench_ceiling_log (id, seq, note) VALUES (%s, %s, %s)",
                             [row, done, "ceiling"])
            done += 1
    print(done)


def cpu_seconds(pids) -> float:
    """User and system CPU the processes have used (all their threads)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def postgres_pids() -> list[int]:
    """The PostgreSQL server's processes on this machine (its backends among them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


class ActivitySampler:
    """Samples pg_stat_activity every `every` seconds in a thread of its own: what the
    client backends of one database are doing (active, idle in transaction, waiting on a
    lock), as shares of the samples."""

    def __init__(self, url: str, database: str, every: float = 0.05):
        self.url, self.database, self.every = url, database, every
        self.counts: Counter = Counter()
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT state, wait_event_type FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                    [self.database]).fetchall()
                for state, wait in rows:
                    self.counts["waiting on a lock" if wait == "Lock" else state or "?"] += 1
                self.samples += 1
                time.sleep(self.every)

    def shares(self) -> dict:
        total = sum(self.counts.values()) or 1
        return {state: round(count / total, 3) for state, count in self.counts.most_common()}


def steady_rate(finished_times: list) -> float:
    """Steps per second between the 20th and 80th percentile of the finish times: the
    steady state, without the consumers' start nor the last run's tail."""
    times = sorted(finished_times)
    if len(times) < 10:
        return 0.0
    low, high = times[len(times) // 5], times[len(times) * 4 // 5]
    seconds = (high - low).total_seconds()
    return (len(times) * 4 // 5 - len(times) // 5) / seconds if seconds > 0 else 0.0


if __name__ == "__main__":
    if sys.argv[1] == "client":
        _client(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))

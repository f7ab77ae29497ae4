"""What every bench section shares: the scratch backend's settings, its consumers, the
floors, the specs it runs, and small measures. The child sets Django up before any section
runs, so what needs Django is imported where it is used."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.processes import patience, start_consumer, stop  # noqa: E402

VAR = ROOT / "var"
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/tollgate_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")


class Bench:
    """One backend's run: its settings, the consumers it started, and the results."""

    SECTIONS = ("runtime", "fairness", "approvals", "scaleout", "profile", "audit", "pages",
                "sweeper", "http", "chat", "soak", "storage")

    def __init__(self, backend: str, env: dict, size: str):
        self.backend, self.env, self.size = backend, env, size
        self.consumers: list[subprocess.Popen] = []
        self.results: dict = {"backend": backend}

    def pick(self, smoke, quick, full):
        """A size for the bench's size: smoke (CI: every section, smallest), quick, full."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.size]

    # consumers ----------------------------------------------------------------------------
    def start_consumers(self, count: int, workers: int, warm: bool = True,
                        env: dict | None = None) -> None:
        for _ in range(count):
            self.consumers.append(start_consumer({**os.environ, **self.env, **(env or {})},
                                                 workers=workers))
        if warm:
            from workflows.tasks import ping

            # A consumer is up: however long a busy machine takes to start one.
            ping().get(blocking=True, timeout=patience(60))

    def stop_consumers(self) -> None:
        for proc in self.consumers:
            stop(proc)
        self.consumers = []

    # floors ---------------------------------------------------------------------------------
    def floor_transaction_pair(self, n: int) -> float:
        """Seconds per raw transaction of one UPDATE and one INSERT."""
        from django.db import connection, transaction

        floor_tables()
        started = time.perf_counter()
        for i in range(n):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE bench_row SET n = n + 1 WHERE id = 1")
                cursor.execute("INSERT INTO bench_log (id, seq, note) VALUES (1, %s, %s)",
                               [i, "floor"])
        return (time.perf_counter() - started) / n

    def floor_huey_chain(self, n: int) -> float:
        """Seconds per hop of a raw Huey chain: each task enqueues the next, no database."""
        import uuid

        from huey.contrib.djhuey import HUEY

        from workflows.tasks import chain_hop

        token = f"bench-chain-{uuid.uuid4().hex}"
        started = time.perf_counter()
        chain_hop(n, token)
        while HUEY.get(token, peek=True) is None:
            if time.perf_counter() - started > 120:
                raise RuntimeError("the Huey chain did not finish")
            time.sleep(0.001)
        return (time.perf_counter() - started) / n

    # the runtime --------------------------------------------------------------------------
    def open_and_finish(self, specs, timeout: float = 600) -> float:
        """Open one run of each spec at once; seconds from the first opening to the last
        run's finish, as the database recorded them (no polling error)."""
        from workflows import engine
        from workflows.models import Run

        started = timezone_now()
        ids = [engine.open_run(spec).run.pk for spec in specs]
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            rows = list(Run.objects.filter(pk__in=ids).values_list("status", "finished_at"))
            if all(status in ("completed", "failed", "cancelled") for status, _ in rows):
                assert {status for status, _ in rows} == {"completed"}, rows
                return (max(finished for _, finished in rows) - started).total_seconds()
            time.sleep(0.05)  # the times come from the database: polling adds no error
        raise RuntimeError("benchmark runs did not finish")

    def guarded(self, section: str, measure) -> None:
        import traceback

        try:
            measure()
        except Exception as exc:
            self.results.setdefault("failed", {})[section] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()


NOOP = {"callable": "workflows.callables.noop"}


def floor_tables() -> None:
    """The floor's two tables, its row to update and its log to insert into, made afresh."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_row (id INTEGER PRIMARY KEY, "
                       "n INTEGER NOT NULL)")
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_log (id INTEGER NOT NULL, "
                       "seq INTEGER NOT NULL, note VARCHAR(100) NOT NULL)")
        cursor.execute("DELETE FROM bench_row")
        cursor.execute("INSERT INTO bench_row (id, n) VALUES (1, 0)")


def chain_spec(name: str, length: int):
    """A linear chain of no-op callable steps."""
    from workflows.specs.storage import store_spec

    return store_spec({"name": name, "steps": [
        {"key": f"s{i}", "run": NOOP, **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(length)]})[0]


def search_plan() -> dict:
    """How the database finds a rare word in the run search: a trigram index (PostgreSQL's
    pg_trgm, SQLite's FTS5 trigram table), not a scan."""
    from django.db import connection

    from workflows.reads import selectors

    if connection.vendor != "postgresql":  # the trigram table's lookup, then the ids
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + selectors.FTS_MATCHES, ["%needle%", 1])
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
        return {"trigram_index": "run_search VIRTUAL TABLE INDEX" in plan, "plan": plan[:500]}
    plan = selectors.runs(q="needle")[:25].explain()
    return {"trigram_index": "run_search_trgm_idx" in plan, "plan": plan[:1500]}


def gate_spec():
    """A gate and the step after it (the approvals, pages and HTTP sections)."""
    from django.contrib.auth.models import Group

    from workflows.specs.storage import store_spec

    Group.objects.get_or_create(name="bench-qa")
    return store_spec({"name": "bench-gate", "steps": [
        {"key": "gate", "approval": {"group": "bench-qa"}},
        {"key": "next", "depends_on": ["gate"],
         "run": {"callable": "workflows.callables.noop"}}]})[0]


def database_bytes() -> int:
    """The database's size in bytes: PostgreSQL's tables, indexes and TOAST; SQLite's pages
    in use."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA freelist_count")
            free = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_size")
            return (pages - free) * cursor.fetchone()[0]
        cursor.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = 'public' AND c.relkind = 'r'")
        return int(cursor.fetchone()[0])


def analyze() -> None:
    """Vacuum and analyze PostgreSQL's tables, as autovacuum keeps them on a database that
    has been running (it vacuums after inserts too): a benchmark fills fresh tables faster
    than autovacuum looks, and would read pages whose visibility nobody has checked yet."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")


def _median_of(results: list[dict], key: str):
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def _rss_mb(pid: int) -> float:
    """Resident memory of a consumer process (its thread workers share it)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def timezone_now():
    from django.utils import timezone

    return timezone.now()


def pg_available() -> bool:
    try:
        import psycopg
        import redis

        psycopg.connect(PG_ADMIN.replace("postgres://", "postgresql://"), connect_timeout=2
                        ).close()
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return True
    except Exception:
        return False

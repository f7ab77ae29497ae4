"""What a step's writes cost PostgreSQL by how many row versions a step writes, on Tollgate's
own tables with their indexes: the engine's five (the completed step, the next step, the run's
counters, two checkpoints), three (one step, the run, one checkpoint) and two (one step, one
checkpoint), beside the floor's pair on a two-column table. Each a transaction of plain
statements; the backend's CPU from /proc. It bounds how far a step with fewer rows could go
(docs/benchmarks.md, "The step path's own SQL").

It writes to copies of the three tables (`LIKE ... INCLUDING ALL`: the same columns, indexes
and defaults) holding a copy of the latest run and its steps, dropped after: the database the
other sections read is left as it was."""

from __future__ import annotations

import itertools


def measure(transactions: int) -> dict:
    """Backend CPU ms a transaction for each shape (the lower of two rounds each)."""
    from django.db import connection

    from bench.plumbing import floor_tables

    floor_tables()
    tables = {"rv_run": "workflows_run", "rv_step": "workflows_step",
              "rv_checkpoint": "workflows_checkpoint"}
    with connection.cursor() as cursor:
        for copy, table in tables.items():
            cursor.execute(f"DROP TABLE IF EXISTS {copy}")
            # Generated columns come as plain ones, so the run's row can be copied in.
            cursor.execute(f"CREATE TABLE {copy} (LIKE {table} INCLUDING ALL "
                           "EXCLUDING GENERATED)")
        cursor.execute("INSERT INTO rv_run SELECT * FROM workflows_run WHERE id = "
                       "(SELECT max(run_id) FROM workflows_step)")
        cursor.execute("INSERT INTO rv_step SELECT * FROM workflows_step WHERE run_id = "
                       "(SELECT id FROM rv_run) ORDER BY \"index\" LIMIT 2")
        cursor.execute("SELECT id FROM rv_run")
        run_id = cursor.fetchone()[0]
        cursor.execute('SELECT id FROM rv_step ORDER BY "index"')
        first, second = (row[0] for row in cursor.fetchall())
    try:
        return _measure(transactions, run_id, first, second)
    finally:
        with connection.cursor() as cursor:
            for copy in tables:
                cursor.execute(f"DROP TABLE IF EXISTS {copy}")


def _measure(transactions: int, run_id: int, first: int, second: int) -> dict:
    from django.db import connection, transaction

    from bench import scale

    seq = itertools.count(1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

        def checkpoint(step):
            cursor.execute(
                "INSERT INTO rv_checkpoint (run_id, seq, kind, step_id, run_status, "
                "step_status, actor_id, actor_name, label, summary, evidence, state_patch, at, "
                "prev_hash, hash) VALUES (%s, %s, 'step_completed', %s, 'running', "
                "'completed', NULL, 'worker', '', 'noop returned', '{}', '{}', now(), %s, %s)",
                [run_id, next(seq), step, "a" * 64, "b" * 64])

        def step(pk, status):
            cursor.execute(
                "UPDATE rv_step SET status = %s, lease_owner = %s, lease_token = %s, "
                "lease_expires_at = now(), last_summary = %s, updated_at = now() WHERE id = %s",
                [status, "worker", "t" * 32, "noop returned", pk])

        def run_row(i):
            cursor.execute(
                "UPDATE rv_run SET served_at = now(), current_step = %s, "
                "checkpoint_seq = %s, chain_head = %s, updated_at = now() WHERE id = %s",
                ["s", i, "c" * 64, run_id])

        shapes = {
            "floor_pair": lambda i: (
                cursor.execute("UPDATE bench_row SET n = n + 1 WHERE id = 1"),
                cursor.execute("INSERT INTO bench_log (id, seq, note) VALUES (1, %s, %s)",
                               [i, "rows"])),
            "five_rows": lambda i: (step(first, "completed"), step(second, "running"),
                                    run_row(i), checkpoint(first), checkpoint(second)),
            "three_rows": lambda i: (step(first, "completed"), run_row(i), checkpoint(first)),
            "two_rows": lambda i: (step(first, "completed"), checkpoint(first)),
        }
        rounds: dict[str, list[float]] = {name: [] for name in shapes}
        for name, write in [*shapes.items(), *shapes.items()]:
            before = scale.cpu_seconds([backend])
            for i in range(transactions):
                with transaction.atomic():
                    write(i)
            rounds[name].append((scale.cpu_seconds([backend]) - before) / transactions * 1e3)
    return {"transactions": transactions,
            "database_cpu_ms": {name: min(found) for name, found in rounds.items()}}

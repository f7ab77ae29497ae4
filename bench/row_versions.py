"""What a step's writes cost PostgreSQL by how many row versions a step writes, on Tollgate's
own tables with their indexes: the engine's five (the completed step, the next step, the run's
counters, two checkpoints), three (one step, the run, one checkpoint) and two (one step, one
checkpoint), beside the floor's pair on a two-column table. Each a transaction of plain
statements; the backend's CPU from /proc. It bounds how far a step with fewer rows could go
(README, "The step path's own SQL")."""

from __future__ import annotations

import itertools


def measure(transactions: int) -> dict:
    """Backend CPU ms a transaction for each shape (the lower of two rounds each)."""
    from django.db import connection, transaction

    from bench import scale
    from bench.plumbing import chain_spec, floor_tables
    from workflows import engine

    floor_tables()
    run = engine.open_run(chain_spec("bench-rows", 3)).run
    first, second = run.steps.order_by("index").values_list("id", flat=True)[:2]
    seq = itertools.count(10_000)

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

        def checkpoint(step):
            cursor.execute(
                "INSERT INTO workflows_checkpoint (run_id, seq, kind, step_id, run_status, "
                "step_status, actor_id, actor_name, label, summary, evidence, state_patch, at, "
                "prev_hash, hash) VALUES (%s, %s, 'step_completed', %s, 'running', "
                "'completed', NULL, 'worker', '', 'noop returned', '{}', '{}', now(), %s, %s)",
                [run.pk, next(seq), step, "a" * 64, "b" * 64])

        def step(pk, status):
            cursor.execute(
                "UPDATE workflows_step SET status = %s, lease_owner = %s, lease_token = %s, "
                "lease_expires_at = now(), last_summary = %s, updated_at = now() WHERE id = %s",
                [status, "worker", "t" * 32, "noop returned", pk])

        def run_row(i):
            cursor.execute(
                "UPDATE workflows_run SET served_at = now(), current_step = %s, "
                "checkpoint_seq = %s, chain_head = %s, updated_at = now() WHERE id = %s",
                ["s", i, "c" * 64, run.pk])

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

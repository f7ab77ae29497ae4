"""The step path without the engine's Python: how far a server-side step could go.

A chain of no-op steps is worked in this process while every statement the engine sends is
recorded with its parameters and transaction. The database as it stood before the chain ran
is copied twice, and the recorded statements are replayed on the copies straight on the
driver, with no Python between them:

- **as sent**: each statement its own round trip, bound and prepared as the engine binds
  it (the engine's database work and round trips, none of its Python);
- **one round trip a transaction** (PostgreSQL): a transaction's statements sent together
  through psycopg's pipeline, prepared as the engine prepares them, as a server-side
  function taking a step's outcome would run them with its plans cached (its lower bound:
  the function would still decide between the statements, in PL/pgSQL).

Each replay must leave the run as the engine left it (its status and checkpoints), or the
figures are not reported. The page versions a transition rings (Redis or a file, not the
database) are not part of either replay.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

from bench.plumbing import PG_ADMIN, PG_URL, VAR, chain_spec


def measure(bench, steps: int) -> dict:
    """ms a step: the engine in this process, the replay as sent and, on PostgreSQL, in
    one round trip a transaction; PostgreSQL's backend CPU a step for each replay."""
    from django.db import connection
    from django.test import override_settings

    from workflows import engine
    from workflows.workers import worker

    postgres = connection.vendor == "postgresql"
    spec = chain_spec("bench-replay", steps)
    engine.open_run(spec)
    started = time.perf_counter()
    _work_all(worker, steps)
    engine_ms = (time.perf_counter() - started) / steps * 1e3

    run = engine.open_run(spec).run
    copies = _copy_database(connection, ("a", "b") if postgres else ("a",))
    try:
        # Every outcome recorded on this connection, where the statements are captured: a
        # batch held past the group-commit hold (a busy machine) would be recorded by the
        # watcher on a connection of its own, and the replay would miss it.
        with override_settings(TOLLGATE_GROUP_COMMIT_HOLD_SECONDS=3600):
            recorded = _record(connection, lambda: _work_all(worker, steps))
        with connection.cursor() as cursor:
            expected = _outcome(lambda sql, params: cursor.execute(sql, params).fetchone()[0],
                                run.pk)
        figures = {"steps": steps, "engine_ms_per_step": engine_ms,
                   "statements_per_step": sum(len(t[1]) for t in recorded) / steps,
                   "transactions_per_step": sum(1 for t in recorded if t[0]) / steps}
        if postgres:
            figures["as_sent"] = _replay_postgres(copies["a"], recorded, steps, expected,
                                                  run.pk, one_message=False)
            figures["one_round_trip"] = _replay_postgres(copies["b"], recorded, steps,
                                                         expected, run.pk, one_message=True)
        else:
            figures["as_sent"] = _replay_sqlite(copies["a"], recorded, steps, expected,
                                                run.pk)
    finally:
        _drop_copies(copies, postgres)
    return figures


def _work_all(worker, steps: int) -> None:
    while worker.work(budget=steps + 10):
        pass


def _record(connection, work) -> list[tuple[bool, list[tuple[str, object, bool]]]]:
    """Every statement `work` sends, grouped in its transactions: (in a transaction,
    [(sql, params, bound on the server)])."""
    import psycopg

    transactions, current = [], []
    rolled_back = []
    postgres = connection.vendor == "postgresql"

    def wrapper(execute, sql, params, many, context):
        if sql.startswith("BEGIN"):  # SQLite's BEGIN IMMEDIATE: the replay opens its own
            return execute(sql, params, many, context)
        raw = getattr(context["cursor"], "cursor", None)
        server = postgres and type(raw) is psycopg.Cursor
        current.extend((sql, p, server) for p in (params if many else [params]))
        result = execute(sql, params, many, context)
        if connection.get_autocommit():
            transactions.append((False, current[:]))
            current.clear()
        return result

    commit, rollback = connection._commit, connection._rollback

    def committed():
        commit()
        if current:
            transactions.append((True, current[:]))
            current.clear()

    def rolled():
        rollback()
        if current:
            rolled_back.append(current[:])
            current.clear()

    connection._commit, connection._rollback = committed, rolled
    try:
        with connection.execute_wrapper(wrapper):
            work()
    finally:
        del connection._commit, connection._rollback
    if rolled_back:
        raise RuntimeError("a transaction rolled back while the chain was recorded; its "
                           "replay would not be the engine's work")
    return transactions


def _outcome(one, run_id: int, mark: str = "%s") -> tuple:
    """The run's status and checkpoint count; `one(sql, params)` answers a statement's first
    value, with `mark` as its placeholder."""
    return (one(f"SELECT status FROM workflows_run WHERE id = {mark}", [run_id]),
            one(f"SELECT COUNT(*) FROM workflows_checkpoint WHERE run_id = {mark}", [run_id]))


def _check(found: tuple, expected: tuple, run_id: int) -> None:
    if found != expected:
        raise RuntimeError(f"the replay left run {run_id} {found[0]} with {found[1]} "
                           f"checkpoints, the engine {expected[0]} with {expected[1]}")


def _admin():
    import psycopg

    return psycopg.connect(PG_ADMIN.replace("postgres://", "postgresql://"), autocommit=True)


def _copy_database(connection, names) -> dict[str, str]:
    """Copies of the database as it stands now, by name: PostgreSQL databases made from it
    as a template; SQLite files written by the online backup."""
    if connection.vendor == "postgresql":
        source = PG_URL.rsplit("/", 1)[1]
        connection.close()
        copies = {}
        with _admin() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                          "datname = %s AND pid <> pg_backend_pid()", [source])
            for name in names:
                copy = f"{source}_replay_{name}"
                admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{source}"')
                copies[name] = PG_URL.rsplit("/", 1)[0] + "/" + copy
        return copies
    connection.ensure_connection()
    copies = {}
    for name in names:
        path = VAR / f"bench-replay-{name}.sqlite3"
        path.unlink(missing_ok=True)
        with sqlite3.connect(path) as target:
            connection.connection.backup(target)
        target.close()
        copies[name] = str(path)
    return copies


def _drop_copies(copies: dict[str, str], postgres: bool) -> None:
    if not postgres:
        for path in copies.values():
            for suffix in ("", "-wal", "-shm"):
                Path(path + suffix).unlink(missing_ok=True)
        return
    with _admin() as admin:
        for url in copies.values():
            admin.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _replay_postgres(url: str, recorded, steps: int, expected: tuple, run_id: int,
                     one_message: bool) -> dict:
    import psycopg

    from bench import scale

    timed, heaviest = _timer()
    with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True,
                         options="-c jit=off") as conn:
        conn.prepare_threshold = 1  # as the engine's own cursors prepare
        client, server = psycopg.ClientCursor(conn), psycopg.Cursor(conn)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        pair = _raw_pair(conn, server, backend, max(steps, 500)) if not one_message else None

        cpu = scale.cpu_seconds([backend])
        started = time.perf_counter()
        if one_message:
            # psycopg's pipeline: a transaction's statements, prepared as the engine's
            # are, go out together and their answers come back together (one round trip,
            # plans cached as a PL/pgSQL function's would be).
            for atomic, statements in recorded:
                with conn.pipeline():
                    if atomic:
                        conn.execute("BEGIN")
                    for sql, params, bound_on_server in statements:
                        (server if bound_on_server else client).execute(sql, params)
                    if atomic:
                        conn.execute("COMMIT")
        else:
            for atomic, statements in recorded:
                if atomic:
                    timed("BEGIN", conn.execute, "BEGIN")
                for sql, params, bound_on_server in statements:
                    timed(sql, (server if bound_on_server else client).execute, sql, params)
                if atomic:
                    timed("COMMIT", conn.execute, "COMMIT")
        elapsed = time.perf_counter() - started
        db_cpu = scale.cpu_seconds([backend]) - cpu
        found = _outcome(lambda sql, params: conn.execute(sql, params).fetchone()[0], run_id)
    _check(found, expected, run_id)
    return {"ms_per_step": elapsed / steps * 1e3,
            "database_cpu_ms_per_step": db_cpu / steps * 1e3,
            **({} if one_message else {"heaviest": heaviest(steps), "raw_pair": pair}),
            "round_trips_per_step": (len(recorded) if one_message else sum(
                len(s) + (2 if atomic else 0) for atomic, s in recorded)) / steps}


def _raw_pair(conn, cursor, backend: int, n: int) -> dict:
    """The floor's transaction on the same connection, straight on the driver: BEGIN, an
    UPDATE, an INSERT, COMMIT; its time and PostgreSQL's CPU, for the replay beside it."""
    from bench import scale

    conn.execute("CREATE TABLE bench_replay_row (id int PRIMARY KEY, n bigint NOT NULL)")
    conn.execute("CREATE TABLE bench_replay_log (id int NOT NULL, seq bigint NOT NULL, "
                 "note varchar(100) NOT NULL)")
    conn.execute("INSERT INTO bench_replay_row VALUES (1, 0)")
    cpu = scale.cpu_seconds([backend])
    started = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN")
        cursor.execute("UPDATE bench_replay_row SET n = n + 1 WHERE id = %s", [1])
        cursor.execute("INSERT INTO bench_replay_log (id, seq, note) VALUES (%s, %s, %s)",
                       [1, i, "floor"])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db_cpu = scale.cpu_seconds([backend]) - cpu
    return {"ms": elapsed / n * 1e3, "database_cpu_ms": db_cpu / n * 1e3}


_QMARK = re.compile(r"(?<!%)%s")


def _replay_sqlite(path: str, recorded, steps: int, expected: tuple, run_id: int) -> dict:
    from django.conf import settings

    synchronous = settings.DATABASES["default"]["OPTIONS"]["init_command"]
    timed, heaviest = _timer()
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in synchronous.split(";"):
            if pragma.strip():
                db.execute(pragma)
        prepared = [(atomic, [(sql if params is None else
                               _QMARK.sub("?", sql).replace("%%", "%"), params or ())
                              for sql, params, _ in statements])
                    for atomic, statements in recorded]
        started = time.perf_counter()
        for atomic, statements in prepared:
            if atomic:
                timed("BEGIN IMMEDIATE", db.execute, "BEGIN IMMEDIATE")
            for sql, params in statements:
                timed(sql, db.execute, sql, params)
            if atomic:
                timed("COMMIT", db.execute, "COMMIT")
        elapsed = time.perf_counter() - started
        found = _outcome(lambda sql, params: db.execute(sql, params).fetchone()[0], run_id,
                         "?")
    finally:
        db.close()
    _check(found, expected, run_id)
    return {"ms_per_step": elapsed / steps * 1e3, "heaviest": heaviest(steps)}


def _timer():
    """`timed(sql, fn, *args)` runs fn and adds its time to the statement's shape (its first
    words); `heaviest(steps)` the five shapes that took longest, in ms a step."""
    spent: dict[str, list] = {}

    def timed(sql, fn, *args):
        started = time.perf_counter()
        fn(*args)
        entry = spent.setdefault(" ".join(sql.split())[:90], [0.0, 0])
        entry[0] += time.perf_counter() - started
        entry[1] += 1

    def heaviest(steps):
        return [{"statement": shape, "ms_per_step": total / steps * 1e3,
                 "per_step": count / steps}
                for shape, (total, count) in sorted(spent.items(), key=lambda kv: -kv[1][0])[:6]]

    return timed, heaviest

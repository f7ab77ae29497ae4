"""`make bench`: what the runtime costs, each figure as a ratio to a floor measured in the same run.

The parent process runs one child per backend (SQLite + SqliteHuey; PostgreSQL + RedisHuey when
reachable), each against a scratch database of its own, then writes var/bench.json and prints a
table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.processes import free_port, start_consumer, start_gunicorn, stop  # noqa: E402
from tests.support.stats import summary  # noqa: E402

VAR = ROOT / "var"
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/tollgate_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")


# --- child: one backend -----------------------------------------------------------------------

def child(backend: str, out: Path, size: str, sections: list[str]) -> None:
    var = VAR / f"bench-{backend}"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    env = {"DJANGO_SETTINGS_MODULE": "tollgate.settings", "DEBUG": "0",
           "SECRET_KEY": "bench-" + "x" * 50, "ALLOWED_HOSTS": "127.0.0.1,testserver",
           "TOLLGATE_SSL_REDIRECT": "0", "TOLLGATE_SECURE_COOKIES": "0",
           "TOLLGATE_VAR_DIR": str(var), "TOLLGATE_HUEY_NAME": f"bench-{backend}",
           "TOLLGATE_NOTIFY": "0", "TOLLGATE_LEASE_SECONDS": "30", "LOG_LEVEL": "WARNING",
           "TOLLGATE_EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
           # The fairness section's backlog is one 5,000-step fan-out.
           "TOLLGATE_MAX_STEPS_PER_RUN": "5000"}
    if backend == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{var / 'bench.sqlite3'}"
        env.pop("TOLLGATE_REDIS_URL", None)
        os.environ.pop("TOLLGATE_REDIS_URL", None)
    else:
        import psycopg

        with psycopg.connect(PG_ADMIN.replace("postgres://", "postgresql://"),
                             autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS tollgate_bench WITH (FORCE)")
            admin.execute("CREATE DATABASE tollgate_bench")
        env["DATABASE_URL"] = PG_URL
        env["TOLLGATE_REDIS_URL"] = REDIS_URL
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    if backend != "sqlite":
        from huey.contrib.djhuey import HUEY

        HUEY.storage.flush_all()
    bench = Bench(backend, env, size)
    try:
        results = bench.run_all(sections)
    finally:
        bench.stop_consumers()
    out.write_text(json.dumps(results, default=str, indent=2))


class Bench:
    def __init__(self, backend: str, env: dict, size: str):
        self.backend, self.env, self.size = backend, env, size
        self.consumers: list[subprocess.Popen] = []
        self.results: dict = {"backend": backend}

    def pick(self, smoke, quick, full):
        """A size for the bench's size: smoke (CI: every section, smallest), quick, full."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.size]

    # consumers ----------------------------------------------------------------------------
    def start_consumers(self, count: int, workers: int, warm: bool = True) -> None:
        for _ in range(count):
            self.consumers.append(start_consumer({**os.environ, **self.env}, workers=workers))
        if warm:
            from workflows.tasks import ping

            ping().get(blocking=True, timeout=60)  # a consumer is up

    def stop_consumers(self) -> None:
        for proc in self.consumers:
            stop(proc)
        self.consumers = []

    # floors ---------------------------------------------------------------------------------
    def floor_transaction_pair(self, n: int) -> float:
        """Seconds per raw transaction of one UPDATE and one INSERT."""
        from django.db import connection, transaction

        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_row (id INTEGER PRIMARY KEY, "
                           "n INTEGER NOT NULL)")
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_log (id INTEGER NOT NULL, "
                           "seq INTEGER NOT NULL, note VARCHAR(100) NOT NULL)")
            cursor.execute("DELETE FROM bench_row")
            cursor.execute("INSERT INTO bench_row (id, n) VALUES (1, 0)")
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

    def runtime(self) -> None:
        """Per-step overhead (linear chain), fan-out and many-run throughput, Tollgate and
        DBOS interleaved in rounds on the same database; medians."""
        from workflows.specs.storage import store_spec

        linear_n, fan_n, runs_n, runs_len = self.pick((20, 10, 2, 5), (100, 50, 5, 10),
                                                      (500, 200, 20, 10))
        rounds = self.pick(1, 1, 3)
        noop = {"callable": "workflows.callables.noop"}

        linear, short = chain_spec("bench-linear", linear_n), chain_spec("bench-short", runs_len)
        fan = store_spec({"name": "bench-fan", "steps": [
            {"key": f"s{i}", "run": noop} for i in range(fan_n)]})[0]
        # The honest floor: the raw work of a step at Tollgate's durability, one UPDATE and one
        # INSERT committed (synchronous=FULL on SQLite); a raw Huey chain is the second
        # reference. Neither includes result polling.
        txn = self.floor_transaction_pair(500)
        hop = self.floor_huey_chain(200)
        self.open_and_finish([linear, fan, *[short] * runs_n])  # warm: connections, caches
        analyze()
        figures = {k: [] for k in ("linear", "fan_out", "runs", "dbos_linear", "dbos_fan_out",
                                   "dbos_runs")}
        for _ in range(rounds):
            figures["linear"].append(self.open_and_finish([linear]) / linear_n * 1e3)
            figures["dbos_linear"].append(dbos_peer(self.backend, "linear", linear_n))
            figures["fan_out"].append(fan_n / self.open_and_finish([fan]))
            figures["dbos_fan_out"].append(dbos_peer(self.backend, "fanout", fan_n))
            figures["runs"].append(runs_n * runs_len / self.open_and_finish([short] * runs_n))
            figures["dbos_runs"].append(dbos_peer(self.backend, "runs", runs_n, runs_len))
        peer = {k: _median_of(figures[f"dbos_{k}"], "per_step_ms" if k == "linear"
                              else "steps_per_s") for k in ("linear", "fan_out", "runs")}
        per_step = statistics.median(figures["linear"])
        self.results["floor"] = {"transaction_pair_ms": txn * 1e3, "huey_chain_hop_ms": hop * 1e3}
        self.results["dbos"] = {"interpreter": next((f.get("interpreter") for f in
                                                     figures["dbos_linear"]
                                                     if f.get("interpreter")), None),
                                "skipped": next((f["skipped"] for f in figures["dbos_linear"]
                                                 if "skipped" in f), None), **peer}
        self.results["linear"] = {
            "steps": linear_n, "rounds_ms_per_step": figures["linear"], "per_step_ms": per_step,
            "ratio_to_floor": per_step / (txn * 1e3),
            "ratio_to_huey_chain": per_step / (hop * 1e3),
            "ratio_to_dbos": per_step / peer["linear"] if peer["linear"] else None}
        for name, steps in (("fan_out", fan_n), ("runs", runs_n * runs_len)):
            rate = statistics.median(figures[name])
            self.results[name] = {"steps": steps, "rounds_steps_per_s": figures[name],
                                  "steps_per_s": rate,
                                  "ratio_to_dbos": rate / peer[name] if peer[name] else None}
        self.results["runs"]["shape"] = f"{runs_n} runs x {runs_len} steps"

    def fairness(self) -> None:
        """With a 5,000-step fan-out in flight, how soon a new 3-step run starts and ends."""
        from workflows import engine
        from workflows.models import Run, Step
        from workflows.specs.storage import store_spec

        width, probes = self.pick((100, 2), (1000, 5), (5000, 10))
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
        self.results["fairness"] = {
            "backlog_steps": width, "probes": probes,
            "backlog_in_flight_at_each_probe": backlog_done,
            "first_step_started_ms": summary(starts), "completed_ms": summary(ends),
            "target_first_step_median_ms": 200, "target_completed_median_ms": 1000}
        if in_flight(backlog):
            engine.cancel_run(backlog, reason="benchmark over")

    def approval_round_trip(self) -> None:
        from django.contrib.auth.models import Group, User
        from django.test import Client
        from django.utils import timezone

        from workflows import engine
        from workflows.models import Step

        spec = gate_spec()
        approver, _ = User.objects.get_or_create(username="bench-approver")
        approver.groups.add(Group.objects.get_or_create(name="bench-qa")[0])
        client = Client()
        client.force_login(approver)
        latencies = []
        # The first press after the consumers start pays for cold caches on both sides (its
        # figure is kept apart, as "first_cold_ms"); the quiet machine's presses follow.
        for _ in range(1 + self.pick(5, 15, 40)):
            run = engine.open_run(spec).run
            time.sleep(0.1)  # workers idle again, as a person's press finds them
            pressed = timezone.now()
            response = client.post(f"/runs/{run.pk}/steps/gate/approve/",
                                   HTTP_HX_REQUEST="true")
            assert response.status_code == 200, response.status_code
            deadline = time.perf_counter() + 10
            while time.perf_counter() < deadline:
                started = Step.objects.filter(run=run, key="next").values_list(
                    "started_at", flat=True)[0]
                if started:
                    latencies.append((started - pressed).total_seconds() * 1e3)
                    break
                time.sleep(0.002)
        if len(latencies) < 2:
            raise RuntimeError("the step after the gate did not start within 10 s")
        self.results["approval_round_trip_ms"] = {
            **summary(latencies[1:]), "target_median_ms": 25, "target_p95_ms": 60,
            "first_cold_ms": latencies[0], "each": [round(x, 1) for x in latencies[1:]]}

    def pages(self) -> None:
        """Server time and queries of each page at a small size and at production size
        (full: 10k goals, 100k runs, 1M checkpoints); the query counts must not move."""
        from django.contrib.auth.models import Group, User
        from django.db import connection
        from django.test import Client

        from bench import data

        viewer, _ = User.objects.get_or_create(username="bench-viewer")
        viewer.groups.add(Group.objects.get_or_create(name="bench-qa")[0])
        client = Client()
        client.force_login(viewer)

        def measure(url, n=20):
            queries = []

            def count(execute, sql, params, many, context):
                queries.append(sql)
                return execute(sql, params, many, context)

            with connection.execute_wrapper(count):
                assert client.get(url).status_code == 200, url
            times = []
            for _ in range(n):
                started = time.perf_counter()
                client.get(url)
                times.append((time.perf_counter() - started) * 1e3)
            return {"queries": len(queries), **summary(times)}

        def all_pages(root, run, n=20):
            return {"inbox": measure("/", n), "goal_tree": measure("/goals/", n),
                    "goal_page": measure(f"/goals/{root.pk}/", n),
                    "progress": measure(f"/goals/{root.pk}/progress/", max(n // 2, 3)),
                    "run_page": measure(f"/runs/{run.pk}/", n),
                    "run_search": measure("/runs/?q=bench+run&opened_from=2000-01-01", n),
                    "run_search_rare": measure("/runs/?q=needle", n)}

        spec = gate_spec()
        goals, runs, per_run, timeline = self.pick((1_000, 2_000, 10, 200),
                                                   (10_000, 10_000, 10, 2_000),
                                                   (10_000, 100_000, 10, 20_000))
        floor = measure("/healthz", 50)
        small_root, small_leaves = data.grow_goals(100)
        data.grow_runs(spec, viewer, 200, per_run, small_leaves)
        small_run = data.grow_timeline(spec, 20)
        analyze()
        small = all_pages(small_root, small_run)
        started = time.perf_counter()
        big_root, big_leaves = data.grow_goals(goals)
        written = data.grow_runs(spec, viewer, runs, per_run, big_leaves)
        big_run = data.grow_timeline(spec, timeline)
        grown_s = time.perf_counter() - started
        analyze()
        big = all_pages(big_root, big_run, 10)
        from goals.models import Goal
        from goals.rollup import rollup
        from goals.tree import among, subtree_by
        from workflows.models import Checkpoint, Run, RunStatus

        # The goal pages read tallies: they must add up to the runs they stand for.
        subtree = [pk for ids in subtree_by(big_root.pk, "status").values() for pk in ids]
        completed = Run.objects.filter(goal_id__in=among(subtree),
                                       status=RunStatus.COMPLETED).count()
        self.results["pages"] = {
            "rollup_matches_runs": rollup(big_root.pk).runs_completed == completed,
            "goals": Goal.objects.count(), "runs": Run.objects.count(),
            "checkpoints": Checkpoint.objects.count(), "checkpoints_written": written,
            "run_page_checkpoints": timeline, "seconds_to_write_data": grown_s,
            "floor_healthz": floor, "small": small, "large": big,
            "target_median_ms": 50,
            "queries_independent_of_size": all(
                small[k]["queries"] == big[k]["queries"] for k in small),
            "ratio_to_floor": {k: v["median"] / floor["median"] for k, v in big.items()},
            "search_plan": search_plan()}

    def sweeper(self) -> None:
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

        from workflows import deadlines, engine

        Group.objects.get_or_create(name="bench-qa")
        deadline_spec = store_spec({"name": "bench-deadline", "steps": [
            {"key": "gate", "approval": {"group": "bench-qa", "timeout_seconds": 3600}}]})[0]
        n = self.pick(2_000, 20_000, 50_000)
        add_steps(n, 1000)
        scan_1, sweep_1, due_1 = timed_scan(), timed_sweep(), timed_deadlines(200)
        add_steps(9 * n, 1000)  # the table grows tenfold; 1,000 leases expire again
        scan_2, sweep_2, due_2 = timed_scan(), timed_sweep(), timed_deadlines(200)
        # The worst case for the sweeper: each dead lease in a run of its own.
        add_steps(10_000, 1000, per_run=10, dead_per_run=1)
        sweep_spread = timed_sweep()
        txn = self.floor_transaction_pair(1000) * 1000
        self.results["sweeper"] = {
            "steps_before": n, "steps_after": 10 * n, "expired_each_time": 1000,
            "scan_ms": [scan_1 * 1e3, scan_2 * 1e3], "sweeps": [sweep_1, sweep_2],
            "sweep_s": [sweep_1["s"], sweep_2["s"]], "sweep_one_per_run": sweep_spread,
            "sweep_one_per_run_s": sweep_spread["s"], "target_s": 2,
            "growth_when_table_grows_tenfold": sweep_2["s"] / sweep_1["s"],
            "scan_growth_when_table_grows_tenfold": scan_2 / scan_1,
            "deadlines_200_gates_s": [due_1, due_2],
            "deadline_growth_when_table_grows_tenfold": due_2 / due_1,
            "floor_1000_transaction_pairs_s": txn, "ratio_to_floor": sweep_2["s"] / txn}

    def http(self) -> None:
        import http.client
        import threading

        from django.contrib.auth.models import Group, User
        from django.test import Client

        from workflows import engine

        spec = gate_spec()
        user, _ = User.objects.get_or_create(username="bench-http")
        user.groups.add(Group.objects.get(name="bench-qa"))
        runs = [engine.open_run(spec).run.pk for _ in range(self.pick(60, 300, 1000))]
        seconds = self.pick(1.0, 5.0, 5.0)
        client = Client()
        client.force_login(user)
        client.get("/")
        cookie = f"sessionid={client.cookies['sessionid'].value}; " \
                 f"csrftoken={client.cookies['csrftoken'].value}"
        csrf = client.cookies["csrftoken"].value
        port = free_port()
        # As the README's production command runs it: four sync workers on two cores, so
        # that one waiting on the database does not leave a core idle.
        web = start_gunicorn({**os.environ, **self.env}, port, workers=4)
        try:
            def load(paths, method="GET", seconds=5.0, clients=8, body=None):
                done, errors = [], []
                stop = time.perf_counter() + seconds
                pending = list(paths)
                lock = threading.Lock()

                def worker():
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    while time.perf_counter() < stop:
                        with lock:
                            if not pending:
                                return
                            path = pending.pop() if method == "POST" else pending[0]
                        conn.request(method, path, body=body, headers={
                            "Cookie": cookie, "X-CSRFToken": csrf, "HX-Request": "true",
                            "Host": "127.0.0.1",
                            "Content-Type": "application/x-www-form-urlencoded"})
                        response = conn.getresponse()
                        response.read()
                        (done if response.status < 400 else errors).append(response.status)

                started = time.perf_counter()
                threads = [threading.Thread(target=worker) for _ in range(clients)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                elapsed = time.perf_counter() - started
                return {"requests": len(done), "errors": len(errors), "seconds": elapsed,
                        "rps": len(done) / elapsed}

            analyze()
            for path in ("/healthz", f"/runs/{runs[0]}/", "/"):  # every worker warm
                load([path], seconds=1.0)
            floor = load(["/healthz"], seconds=seconds)
            page = load([f"/runs/{runs[0]}/"], seconds=seconds)
            polls = self.inbox_polls(client, port, load, web.pid, seconds)
            half = len(runs) // 2
            # Approve as the inbox's button does (the decided card comes back), and as the
            # run page's does (the whole run comes back).
            inbox = load([f"/runs/{pk}/steps/gate/approve/" for pk in runs[:half]], "POST",
                         body="view=inbox", seconds=seconds)
            approve = load([f"/runs/{pk}/steps/gate/approve/" for pk in runs[half:]], "POST",
                           seconds=seconds)
            self.results["http"] = {
                "clients": 8, "gunicorn_workers": 4, "floor_healthz": floor,
                "run_page": page, "approve_from_inbox": inbox, "approve": approve,
                "inbox_polls": polls,
                "ratio_to_floor": {"run_page": page["rps"] / floor["rps"],
                                   "approve_from_inbox": inbox["rps"] / floor["rps"],
                                   "approve": approve["rps"] / floor["rps"]},
                "target_ratio": 0.5}
        finally:
            stop(web, sig=15)

    def scaleout(self) -> None:
        """Many short runs on 1, 2 and 4 consumers: steps per second beside the same number
        of raw clients' write ceiling and DBOS's queue, with where the CPU went."""
        if self.backend != "postgres":
            self.results["scaleout"] = {"skipped": "PostgreSQL only: SQLite takes one writer "
                                                   "at a time"}
            return
        from django.db import connection, transaction

        from bench import scale
        from workflows import engine
        from workflows.models import Run, Step

        runs_n, length = self.pick((30, 5), (150, 5), (300, 5))
        topologies = self.pick([(1, 2), (2, 2)], [(1, 2), (2, 2), (4, 2)],
                               [(1, 2), (1, 4), (2, 2), (4, 2)])
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
        for consumers, threads in topologies:
            self.start_consumers(consumers, threads)
            time.sleep(2)  # every consumer up and idle
            cpu = (scale.cpu_seconds(p.pid for p in self.consumers),
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
            used = (scale.cpu_seconds(p.pid for p in self.consumers) - cpu[0],
                    scale.cpu_seconds(scale.postgres_pids()) - cpu[1])
            finished = list(Step.objects.filter(run_id__in=ids).values_list("finished_at",
                                                                           flat=True))
            seconds = (max(finished) - opened).total_seconds()
            steps = len(finished)
            written = next_xid() - before - 1  # less the opening's transaction
            self.stop_consumers()
            ceiling = scale.ceiling(url, consumers * threads)
            rate = steps / seconds
            rows.append({
                "consumers": consumers, "threads": threads, "steps": steps,
                "steps_per_s": rate, "steady_steps_per_s": scale.steady_rate(finished),
                "raw_ceiling_tps": ceiling, "fraction_of_ceiling": rate / ceiling,
                "consumer_cpu_ms_per_step": used[0] / steps * 1e3,
                "postgres_cpu_ms_per_step": used[1] / steps * 1e3,
                "cpu_busy_share": (used[0] + used[1]) / (seconds * (os.cpu_count() or 1)),
                "write_transactions_per_step": written / steps,
                "backends": activity.shares()})
        peer = dbos_peer(self.backend, "queue", runs_n, length)
        self.results["scaleout"] = {
            "workload": f"{runs_n} runs x {length} no-op steps, opened at once",
            "rows": rows, "dbos_queue": peer, "target_fraction_of_ceiling": 0.5}

    def profile(self) -> None:
        """Where a chained step's time goes, in this process (no consumers): cProfile's
        heaviest functions by their own time, and the share of each layer."""
        import cProfile
        import pstats

        from workflows import engine
        from workflows.workers import worker

        n = self.pick(50, 200, 500)
        spec = chain_spec("bench-profile", n)
        engine.open_run(spec)
        while worker.work(budget=60):  # warm
            pass
        engine.open_run(spec)
        profiler = cProfile.Profile()
        profiler.enable()
        while worker.work(budget=120):
            pass
        profiler.disable()
        stats = pstats.Stats(profiler).stats
        total = sum(entry[2] for entry in stats.values())
        layers: dict[str, float] = {}
        heaviest = []
        for (file, line, name), (_, calls, own, _, _) in stats.items():
            layer = ("database driver" if "psycopg" in file or "sqlite3" in file or (
                file == "~" and ("execute" in name or "commit" in name or "fetch" in name))
                     else "django" if "/django/" in file
                     else "tollgate" if "/workflows/" in file or "/tollgate/" in file
                     else "python")
            layers[layer] = layers.get(layer, 0) + own
            heaviest.append((own, f"{Path(file).name}:{line} {name}", calls))
        heaviest.sort(reverse=True)
        self.results["profile"] = {
            "steps": n, "profiled_ms_per_step": total / n * 1e3,
            "layers": {k: round(v / total, 3) for k, v in
                       sorted(layers.items(), key=lambda kv: -kv[1])},
            "heaviest": [{"function": where, "ms_per_step": own / n * 1e3,
                          "calls_per_step": calls / n}
                         for own, where, calls in heaviest[:12]]}

    def inbox_polls(self, client, port, load, web_pid, seconds) -> dict:
        """What 500 open inboxes cost: each polls every 5 s with the cards it shows (200
        here) and hears "nothing changed" (204); the CPU gunicorn and the database spend per
        poll, scaled to 500 inboxes, as a share of one core."""
        import re

        from bench import scale

        shown = re.findall(r'name="have" value="([0-9]+:[0-9.]+)"', client.get("/").text)
        if not shown:
            raise RuntimeError("the inbox showed no cards to poll for")
        path = "/?poll=1&" + "&".join(f"have={item}" for item in shown)
        workers = [int(pid) for pid in Path(f"/proc/{web_pid}/task/{web_pid}/children")
                   .read_text().split()]
        servers = scale.postgres_pids() if self.backend == "postgres" else []
        cpu = scale.cpu_seconds([web_pid, *workers]), scale.cpu_seconds(servers)
        done = load([path], seconds=seconds)
        web_cpu = scale.cpu_seconds([web_pid, *workers]) - cpu[0]
        db_cpu = scale.cpu_seconds(servers) - cpu[1]
        per_poll = (web_cpu + db_cpu) / max(done["requests"], 1)
        return {**done, "cards": len(shown), "web_cpu_ms_per_poll": web_cpu /
                max(done["requests"], 1) * 1e3, "database_cpu_ms_per_poll": db_cpu /
                max(done["requests"], 1) * 1e3, "poll_every_s": 5,
                "cores_for_500_inboxes": per_poll * 500 / 5}

    def soak(self) -> None:
        """Many runs of callables, commands and shell steps on two consumers of four threads:
        the consumers' resident memory after each 10,000 steps (flat after warm-up)."""
        from workflows.models import Run
        from workflows.specs.storage import store_spec

        per_round, rounds = self.pick((200, 2), (2_000, 3), (10_000, 5))
        spec = store_spec({"name": "bench-soak", "steps": [
            {"key": "fetch", "run": {"callable": "workflows.callables.noop"}},
            {"key": "build", "depends_on": ["fetch"], "run": {"command": ["true"]}},
            {"key": "test", "depends_on": ["fetch"], "run": {"shell": "echo ok"}},
            {"key": "pack", "depends_on": ["build", "test"],
             "run": {"callable": "workflows.callables.noop"}},
            {"key": "note", "depends_on": ["pack"],
             "run": {"callable": "workflows.callables.noop"}},
        ]})[0]
        self.start_consumers(2, 4)
        rss, seconds = [], []
        try:
            for _ in range(rounds):
                started = time.perf_counter()
                self.open_and_finish([spec] * (per_round // 5), timeout=3600)
                seconds.append(time.perf_counter() - started)
                rss.append(sum(_rss_mb(proc.pid) for proc in self.consumers))
        finally:
            self.stop_consumers()
        failed = Run.objects.filter(spec_name="bench-soak").exclude(status="completed").count()
        self.results["soak"] = {
            "steps_per_round": per_round, "rounds": rounds, "consumers": 2, "threads": 4,
            "rss_mb": rss, "seconds": seconds, "runs_not_completed": failed,
            "growth_after_warmup": rss[-1] / rss[1] - 1, "target_growth": 0.10}

    def storage(self) -> None:
        """Bytes a finished run costs on disk: the database's size before and after runs of
        a five-step spec with a gate (tables and indexes; SQLite's pages in use)."""
        from django.contrib.auth.models import Group, User

        from workflows import engine
        from workflows.models import Checkpoint, Run
        from workflows.specs.storage import store_spec
        from workflows.workers import worker

        n = self.pick(20, 100, 500)
        noop = {"callable": "workflows.callables.noop"}
        spec = store_spec({"name": "bench-storage", "steps": [
            {"key": "build", "run": noop}, {"key": "test", "depends_on": ["build"], "run": noop},
            {"key": "gate", "depends_on": ["test"], "approval": {"group": "bench-store"}},
            {"key": "deploy", "depends_on": ["gate"], "run": noop},
            {"key": "note", "depends_on": ["deploy"], "run": noop}]})[0]
        approver, _ = User.objects.get_or_create(username="bench-store")
        approver.groups.add(Group.objects.get_or_create(name="bench-store")[0])
        before = database_bytes()
        checkpoints = Checkpoint.objects.count()
        ids = [engine.open_run(spec).run.pk for _ in range(n)]
        while worker.work(budget=60):
            pass
        for run in Run.objects.filter(pk__in=ids):
            engine.approve(run, "gate", user=approver)
        while worker.work(budget=60):
            pass
        assert Run.objects.filter(pk__in=ids, status="completed").count() == n
        analyze()
        grown = database_bytes() - before
        self.results["storage"] = {
            "runs": n, "steps_per_run": 5, "bytes_per_run": grown / n,
            "checkpoints_per_run": (Checkpoint.objects.count() - checkpoints) / n}

    SECTIONS = ("runtime", "fairness", "approvals", "scaleout", "profile", "pages", "sweeper",
                "http", "soak", "storage")

    def run_all(self, sections=SECTIONS) -> dict:
        """Each section on its own: one that fails says why in the results (its rows read
        "-") and the others still run; every process a section started is stopped."""
        with_consumers = [s for s in ("runtime", "fairness", "approvals") if s in sections]
        if with_consumers:
            self.start_consumers(2, 4)
            try:
                for section in with_consumers:
                    self.guarded(section, getattr(
                        self, section if section != "approvals" else "approval_round_trip"))
            finally:
                self.stop_consumers()
        for section in ("scaleout", "profile", "pages", "sweeper", "http", "soak", "storage"):
            if section in sections:
                self.guarded(section, getattr(self, section))
                self.stop_consumers()  # whatever a failed section left running
        return self.results

    def guarded(self, section: str, measure) -> None:
        import traceback

        try:
            measure()
        except Exception as exc:
            self.results.setdefault("failed", {})[section] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()


# --- the DBOS peer ---------------------------------------------------------------------------

DBOS_PEER = ROOT / "bench" / "dbos_peer.py"


def dbos_interpreters() -> list[str]:
    """Interpreters to try for the DBOS peer: BENCH_DBOS_PYTHON, this one, any python3.11
    (DBOS's SQLite schema needs SQLite 3.42, and some builds link an older one)."""
    found = [os.environ.get("BENCH_DBOS_PYTHON", ""), sys.executable,
             str(VAR / "dbos-venv" / "bin" / "python"), shutil.which("python3.11") or ""]
    found += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.11*/bin/python"))
    return [p for p in dict.fromkeys(found) if p and Path(p).exists()]


DBOS_VERSION = "3.4.0"


def sqlite_version(python: str) -> tuple[int, ...]:
    # dbos_peer.py uses pysqlite3 (a recent SQLite) where it is installed.
    probe = ("try:\n import pysqlite3 as s\nexcept ImportError:\n import sqlite3 as s\n"
             "print(s.sqlite_version)")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    try:
        return tuple(int(part) for part in done.stdout.strip().split("."))
    except ValueError:
        return (0,)


def ensure_dbos_peer() -> str:
    """The bench installs its peer itself: when no interpreter has dbos, a venv of its own
    (var/dbos-venv) gets dbos, made from the interpreter whose SQLite is newest (DBOS's
    SQLite schema needs 3.42). Returns what it did, for the report."""
    for python in dbos_interpreters():
        if subprocess.run([python, "-c", "import dbos"], capture_output=True).returncode == 0:
            return f"dbos found in {python}"
    candidates = [p for p in dbos_interpreters() if "dbos-venv" not in p]
    if not candidates:
        return "no interpreter to make a DBOS venv from"
    base = max(candidates, key=sqlite_version)
    venv = VAR / "dbos-venv"
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        return f"could not make a venv from {base}: {made.stderr.strip()[-300:]}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    installed = subprocess.run([*pip, f"dbos=={DBOS_VERSION}", "psycopg[binary]"],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        return f"could not install dbos: {installed.stderr.strip()[-300:]}"
    # A recent SQLite for DBOS's schema, where a wheel exists for this machine.
    subprocess.run([*pip, "pysqlite3-binary"], capture_output=True, timeout=900)
    version = ".".join(map(str, sqlite_version(str(venv / "bin" / "python"))))
    return f"installed dbos {DBOS_VERSION} in {venv} (from {base}; SQLite {version})"


def dbos_peer(backend: str, workload: str, n: int, m: int = 0) -> dict:
    """One DBOS workload (see dbos_peer.py) on a fresh database of the same kind, in the
    first interpreter that has dbos; {"skipped": why} where none does."""
    if backend == "sqlite":
        path = VAR / "bench-dbos.sqlite3"
        for leftover in (path, path.with_suffix(".sqlite3-wal"), path.with_suffix(".sqlite3-shm")):
            leftover.unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    else:
        import psycopg

        with psycopg.connect(PG_ADMIN.replace("postgres://", "postgresql://"),
                             autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS tollgate_bench_dbos WITH (FORCE)")
        url = PG_ADMIN.replace("postgres://", "postgresql://").rsplit("/", 1)[0] + \
            "/tollgate_bench_dbos"
    tried, too_old = [], []
    for python in dbos_interpreters():
        probe = subprocess.run([python, "-c", "import dbos"], capture_output=True)
        if probe.returncode != 0:
            continue
        if backend == "sqlite" and sqlite_version(python) < (3, 42):
            too_old.append(f"{python} has SQLite {'.'.join(map(str, sqlite_version(python)))}")
            continue
        done = subprocess.run([python, str(DBOS_PEER), url, workload, str(n), str(m)],
                              capture_output=True, text=True, timeout=900)
        tried.append(python)
        if done.returncode == 0 and done.stdout.strip():
            return {**json.loads(done.stdout.strip().splitlines()[-1]), "interpreter": python}
    if too_old and not tried:
        return {"skipped": "DBOS's SQLite schema needs SQLite 3.42; " + "; ".join(too_old)}
    return {"skipped": "no interpreter with dbos ran" + (f" (tried {tried})" if tried else
                                                         "; pip install -e '.[bench]'")}


NOOP = {"callable": "workflows.callables.noop"}


def chain_spec(name: str, length: int):
    """A linear chain of no-op callable steps."""
    from workflows.specs.storage import store_spec

    return store_spec({"name": name, "steps": [
        {"key": f"s{i}", "run": NOOP, **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(length)]})[0]


def search_plan() -> dict:
    """How the database finds a rare word in the run search (PostgreSQL: the trigram index,
    not a scan)."""
    from django.db import connection

    from workflows import selectors

    plan = selectors.runs(q="needle")[:25].explain()
    if connection.vendor != "postgresql":
        return {"trigram_index": False, "plan": plan[:500]}
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


# --- parent -------------------------------------------------------------------------------

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


def verdict(value: float, target: float, *, at_most: bool = True) -> str:
    """"ok", or how far a figure misses its target."""
    met = value <= target if at_most else value >= target
    if met:
        return "ok"
    return f"misses {value / target:.1f}x" if at_most else f"misses {target / value:.1f}x"


def table(results: list[dict]) -> str:
    """Every figure beside its target and its verdict ("ok" or by how much it misses)."""
    width = 30
    lines = [f"{'measure':<46}" + "".join(f"{r['backend']:>{width}}" for r in results)
             + "   target"]

    def row(label, fn, target=""):
        cells = []
        for r in results:
            try:
                cells.append(fn(r))
            except (KeyError, TypeError, ZeroDivisionError, IndexError, ValueError):
                cells.append("-")
        lines.append(f"{label:<46}" + "".join(f"{c:>{width}}" for c in cells)
                     + (f"   {target}" if target else ""))

    def per_step(r):
        linear = r["linear"]
        return (f"{linear['per_step_ms']:.2f} ({linear['ratio_to_floor']:.1f}x, "
                f"{verdict(linear['ratio_to_floor'], 1.5)})")

    row("floor: UPDATE+INSERT transaction ms", lambda r: f"{r['floor']['transaction_pair_ms']:.2f}")
    row("raw Huey chain: ms per hop", lambda r: f"{r['floor']['huey_chain_hop_ms']:.2f}")
    row("DBOS 3.4 linear no-op steps: ms/step",
        lambda r: f"{r['dbos']['linear']:.2f}" if r["dbos"]["linear"] else "skipped")
    row("linear no-op steps: ms/step (x floor)", per_step, "<= 1.5x floor")
    row("linear: x DBOS (below 1 is faster)",
        lambda r: (f"{r['linear']['ratio_to_dbos']:.2f}x "
                   f"({verdict(r['linear']['ratio_to_dbos'], 0.5)})")
        if r["linear"]["ratio_to_dbos"] else "skipped", "<= 0.5x DBOS")
    row("fan-out: steps/s (DBOS)",
        lambda r: f"{r['fan_out']['steps_per_s']:.0f} ({_or_skipped(r['dbos']['fan_out'])})")
    row("short runs: steps/s (DBOS)",
        lambda r: f"{r['runs']['steps_per_s']:.0f} ({_or_skipped(r['dbos']['runs'])})")
    row("step path profile: engine/django/driver",
        lambda r: "/".join(f"{r['profile']['layers'].get(k, 0) * 100:.0f}%"
                           for k in ("tollgate", "django", "database driver")))
    row("beside a backlog: start / end ms",
        lambda r: f"{r['fairness']['first_step_started_ms']['median']:.0f} / "
                  f"{r['fairness']['completed_ms']['median']:.0f}", "200 / 1000")
    row("approve -> next step started: median ms",
        lambda r: f"{r['approval_round_trip_ms']['median']:.1f}", "<= 25")
    row("approve -> next step started: p95 ms",
        lambda r: f"{r['approval_round_trip_ms']['p95']:.1f} "
                  f"({verdict(r['approval_round_trip_ms']['p95'], 60)})", "<= 60")
    for index in range(4):
        row(f"scale-out #{index + 1}: consumers x threads",
            lambda r, i=index: "{consumers} x {threads}".format(**r["scaleout"]["rows"][i]))
        row("  steps/s, raw ceiling tps",
            lambda r, i=index: "{:.0f}, {:.0f}".format(
                r["scaleout"]["rows"][i]["steps_per_s"],
                r["scaleout"]["rows"][i]["raw_ceiling_tps"]))
        row("  share of ceiling",
            lambda r, i=index: "{:.0%} ({})".format(
                r["scaleout"]["rows"][i]["fraction_of_ceiling"],
                verdict(r["scaleout"]["rows"][i]["fraction_of_ceiling"], 0.5, at_most=False)),
            ">= 50%")
        row("  CPU ms/step consumer, db; writes/step",
            lambda r, i=index: "{:.1f}, {:.1f}; {:.2f}".format(
                r["scaleout"]["rows"][i]["consumer_cpu_ms_per_step"],
                r["scaleout"]["rows"][i]["postgres_cpu_ms_per_step"],
                r["scaleout"]["rows"][i]["write_transactions_per_step"]))
    row("scale-out: DBOS queue steps/s",
        lambda r: f"{r['scaleout']['dbos_queue']['steps_per_s']:.0f}")
    row("pages at size: goals / runs / checkpoints",
        lambda r: f"{r['pages']['goals'] // 1000}k / {r['pages']['runs'] // 1000}k / "
                  f"{r['pages']['checkpoints'] / 1e6:.2f}M")
    for page in ("inbox", "goal_tree", "goal_page", "progress", "run_page", "run_search",
                 "run_search_rare"):
        row(f"{page}: queries small -> large, median ms",
            lambda r, p=page: f"{r['pages']['small'][p]['queries']} -> "
                              f"{r['pages']['large'][p]['queries']}, "
                              f"{r['pages']['large'][p]['median']:.1f} "
                              f"({verdict(r['pages']['large'][p]['median'], 50)})",
            "same, <= 50")
    row("goal rollup equals its runs (tallies)",
        lambda r: "yes" if r["pages"]["rollup_matches_runs"] else "NO")
    row("run search uses the trigram index",
        lambda r: "yes" if r["pages"]["search_plan"]["trigram_index"] else "no (scan)")
    row("sweep 1000 expired: s at N, 10N steps",
        lambda r: f"{r['sweeper']['sweep_s'][0]:.2f}, {r['sweeper']['sweep_s'][1]:.2f}",
        "flat, <= 2")
    row("sweep 1000 expired, one per run: s",
        lambda r: f"{r['sweeper']['sweep_one_per_run_s']:.2f}", "<= 2")
    row("expired-lease scan ms at N, 10N",
        lambda r: f"{r['sweeper']['scan_ms'][0]:.1f}, {r['sweeper']['scan_ms'][1]:.1f}")
    row("deadline task, 200 gates: s at N, 10N",
        lambda r: f"{r['sweeper']['deadlines_200_gates_s'][0]:.2f}, "
                  f"{r['sweeper']['deadlines_200_gates_s'][1]:.2f}", "flat")
    row("HTTP /healthz floor req/s", lambda r: f"{r['http']['floor_healthz']['rps']:.0f}")
    for name, label in (("run_page", "run page"), ("approve_from_inbox", "approve (inbox)"),
                        ("approve", "approve (run page)")):
        row(f"HTTP {label} req/s (x floor)",
            lambda r, n=name: f"{r['http'][n]['rps']:.0f} "
                              f"({r['http']['ratio_to_floor'][n]:.2f}x, "
                              f"{verdict(r['http']['ratio_to_floor'][n], 0.5, at_most=False)})",
            ">= 0.5x" if name != "run_page" else "")
    row("500 inboxes polling every 5 s: cores",
        lambda r: f"{r['http']['inbox_polls']['cores_for_500_inboxes']:.2f} "
                  f"({r['http']['inbox_polls']['web_cpu_ms_per_poll']:.1f}+"
                  f"{r['http']['inbox_polls']['database_cpu_ms_per_poll']:.1f} ms/poll)")
    row("soak: consumer RSS MB per round",
        lambda r: " ".join(f"{mb:.0f}" for mb in r["soak"]["rss_mb"]))
    row("soak: growth after warm-up",
        lambda r: f"{r['soak']['growth_after_warmup'] * 100:+.1f}%", "<= +10%")
    row("storage: bytes per finished run (5 steps)",
        lambda r: f"{r['storage']['bytes_per_run']:.0f} "
                  f"({r['storage']['checkpoints_per_run']:.0f} checkpoints)")
    return "\n".join(lines)


def _or_skipped(value) -> str:
    return f"{value:.0f}" if value else "skipped"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["sqlite", "postgres"])
    parser.add_argument("--out", type=Path, help="where the figures go (var/bench.json)")
    parser.add_argument("--size", choices=["smoke", "quick", "full"], default="full",
                        help="full (the README's figures), quick, or smoke (every section at "
                             "its smallest, as CI runs it)")
    parser.add_argument("--quick", action="store_true", help="the same as --size quick")
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--sections", default=",".join(Bench.SECTIONS),
                        help=f"a comma-separated subset of {', '.join(Bench.SECTIONS)}")
    args = parser.parse_args()
    size = "quick" if args.quick else args.size
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(Bench.SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.backend:
        child(args.backend, args.out, size, sections)
        return
    backends = [args.only] if args.only else ["sqlite"] + (["postgres"] if pg_available()
                                                          else [])
    if {"runtime", "scaleout"} & set(sections):
        print("DBOS peer: " + ensure_dbos_peer(), flush=True)
    results = []
    for backend in backends:
        out = VAR / f"bench-{backend}.json"
        out.unlink(missing_ok=True)
        print(f"benchmarking {backend} ...", flush=True)
        done = subprocess.run([sys.executable, __file__, "--backend", backend, "--out",
                               str(out), "--sections", ",".join(sections), "--size", size],
                              cwd=ROOT)
        if done.returncode != 0 or not out.exists():
            print(f"benchmarking {backend} stopped (exit {done.returncode}); its rows say "
                  "what was measured", flush=True)
        results.append(json.loads(out.read_text()) if out.exists() else {"backend": backend})
    report = {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size": size,
              "sections": sections,
              "machine": {"cpus": os.cpu_count()}, "results": results}
    written = args.out or VAR / "bench.json"
    written.write_text(json.dumps(report, indent=2, default=str))
    print(table(results))
    for r in results:
        for section, why in r.get("failed", {}).items():
            print(f"{r['backend']}: section {section} failed: {why}")
    for r in results:
        peer = r.get("dbos", {})
        print(f"DBOS peer on {r['backend']}: " + (f"ran in {peer['interpreter']}"
                                                 if peer.get("interpreter") else
                                                 peer.get("skipped") or "skipped"))
    print(f"\nwritten to {written}")


if __name__ == "__main__":
    main()

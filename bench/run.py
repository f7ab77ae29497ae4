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
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers import ensure_dbos_peer  # noqa: E402
from bench.plumbing import PG_ADMIN, PG_URL, REDIS_URL, VAR, Bench, pg_available  # noqa: E402
from bench.report import table  # noqa: E402
from bench.sections import (  # noqa: E402
    approvals,
    audit,
    chat,
    fairness,
    http,
    pages,
    profile,
    runtime,
    scaleout,
    soak,
    storage,
    sweeper,
)

MEASURES = {"runtime": runtime.measure, "fairness": fairness.measure,
            "approvals": approvals.measure, "scaleout": scaleout.measure,
            "profile": profile.measure, "pages": pages.measure, "sweeper": sweeper.measure,
            "http": http.measure, "soak": soak.measure, "storage": storage.measure,
            "audit": audit.measure, "chat": chat.measure}


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
           "TOLLGATE_MAX_STEPS_PER_RUN": "5000",
           # Its consumers run the bench's own no-op commands as themselves (a production
           # consumer refuses to without TOLLGATE_COMMAND_USER).
           "TOLLGATE_COMMANDS_AS_CONSUMER": "1"}
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
        results = run_sections(bench, sections)
    finally:
        bench.stop_consumers()
    out.write_text(json.dumps(results, default=str, indent=2))


def run_sections(bench: Bench, sections) -> dict:
    """Each section on its own: one that fails says why in the results (its rows read
    "-") and the others still run; every process a section started is stopped."""
    with_consumers = [s for s in ("runtime", "fairness", "approvals") if s in sections]
    if with_consumers:
        bench.start_consumers(2, 4)
        try:
            for section in with_consumers:
                bench.guarded(section, partial(MEASURES[section], bench))
        finally:
            bench.stop_consumers()
    for section in ("scaleout", "profile", "audit", "pages", "sweeper", "http", "chat",
                    "soak", "storage"):
        if section in sections:
            bench.guarded(section, partial(MEASURES[section], bench))
            bench.stop_consumers()  # whatever a failed section left running
    return bench.results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["sqlite", "postgres"])
    parser.add_argument("--out", type=Path, help="where the figures go (var/bench.json)")
    parser.add_argument("--size", choices=["smoke", "quick", "full"], default="full",
                        help="full (the figures in docs/benchmarks.md), quick, or smoke "
                             "(every section at its smallest, as CI runs it)")
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

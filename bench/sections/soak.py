"""A long run of chains: memory stays flat."""

from __future__ import annotations

import time

from bench.plumbing import _rss_mb


def measure(bench) -> None:
    """Many runs of callables, commands and shell steps on two consumers of four threads:
    the consumers' resident memory after each 10,000 steps (flat after warm-up)."""
    from workflows.models import Run
    from workflows.specs.storage import store_spec

    per_round, rounds = bench.pick((200, 2), (2_000, 3), (10_000, 5))
    spec = store_spec({"name": "bench-soak", "steps": [
        {"key": "fetch", "run": {"callable": "workflows.callables.noop"}},
        {"key": "build", "depends_on": ["fetch"], "run": {"command": ["true"]}},
        {"key": "test", "depends_on": ["fetch"], "run": {"shell": "echo ok"}},
        {"key": "pack", "depends_on": ["build", "test"],
         "run": {"callable": "workflows.callables.noop"}},
        {"key": "note", "depends_on": ["pack"],
         "run": {"callable": "workflows.callables.noop"}},
    ]})[0]
    bench.start_consumers(2, 4)
    rss, seconds = [], []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            bench.open_and_finish([spec] * (per_round // 5), timeout=3600)
            seconds.append(time.perf_counter() - started)
            rss.append(sum(_rss_mb(proc.pid) for proc in bench.consumers))
    finally:
        bench.stop_consumers()
    failed = Run.objects.filter(spec_name="bench-soak").exclude(status="completed").count()
    bench.results["soak"] = {
        "steps_per_round": per_round, "rounds": rounds, "consumers": 2, "threads": 4,
        "rss_mb": rss, "seconds": seconds, "runs_not_completed": failed,
        "growth_after_warmup": rss[-1] / rss[1] - 1, "target_growth": 0.10}

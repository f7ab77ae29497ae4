"""The step path under cProfile: driver, Tollgate, Django, Python."""

from __future__ import annotations

from pathlib import Path

from bench import replay, row_versions
from bench.plumbing import chain_spec


def measure(bench) -> None:
    """Where a chained step's time goes, in this process (no consumers): cProfile's
    heaviest functions by their own time, and the share of each layer."""
    import cProfile
    import pstats

    from workflows import engine
    from workflows.workers import worker

    n = bench.pick(50, 200, 500)
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
    bench.results["profile"] = {
        "steps": n, "profiled_ms_per_step": total / n * 1e3,
        "layers": {k: round(v / total, 3) for k, v in
                   sorted(layers.items(), key=lambda kv: -kv[1])},
        "heaviest": [{"function": where, "ms_per_step": own / n * 1e3,
                      "calls_per_step": calls / n}
                     for own, where, calls in heaviest[:12]],
        # The same work's statements without the engine's Python, as sent and (PostgreSQL)
        # one round trip a transaction: how far a server-side step could go.
        "replay": replay.measure(bench, n)}
    from django.db import connection

    if connection.vendor == "postgresql":
        # What fewer rows a step would cost: the bound on the replay's database CPU.
        bench.results["profile"]["row_versions"] = row_versions.measure(
            bench.pick(300, 2000, 3000))

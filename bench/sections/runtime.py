"""Chains and fan-outs of no-op steps on two consumers, beside the raw transaction and Huey
floors and the DBOS peer."""

from __future__ import annotations

import statistics

from bench.peers import dbos_peer
from bench.plumbing import _median_of, analyze, chain_spec


def measure(bench) -> None:
    """Per-step overhead (linear chain), fan-out and many-run throughput, Tollgate and
    DBOS interleaved in rounds on the same database; medians."""
    from workflows.specs.storage import store_spec

    linear_n, fan_n, runs_n, runs_len = bench.pick((20, 10, 2, 5), (100, 50, 5, 10),
                                                  (500, 200, 20, 10))
    rounds = bench.pick(1, 1, 3)
    noop = {"callable": "workflows.callables.noop"}

    linear, short = chain_spec("bench-linear", linear_n), chain_spec("bench-short", runs_len)
    fan = store_spec({"name": "bench-fan", "steps": [
        {"key": f"s{i}", "run": noop} for i in range(fan_n)]})[0]
    # The honest floor: the raw work of a step at Tollgate's durability, one UPDATE and one
    # INSERT committed (synchronous=FULL on SQLite); a raw Huey chain is the second
    # reference. Neither includes result polling.
    txn = bench.floor_transaction_pair(500)
    hop = bench.floor_huey_chain(200)
    bench.open_and_finish([linear, fan, *[short] * runs_n])  # warm: connections, caches
    analyze()
    figures = {k: [] for k in ("linear", "fan_out", "runs", "dbos_linear", "dbos_fan_out",
                               "dbos_runs")}
    for _ in range(rounds):
        figures["linear"].append(bench.open_and_finish([linear]) / linear_n * 1e3)
        figures["dbos_linear"].append(dbos_peer(bench.backend, "linear", linear_n))
        figures["fan_out"].append(fan_n / bench.open_and_finish([fan]))
        figures["dbos_fan_out"].append(dbos_peer(bench.backend, "fanout", fan_n))
        figures["runs"].append(runs_n * runs_len / bench.open_and_finish([short] * runs_n))
        figures["dbos_runs"].append(dbos_peer(bench.backend, "runs", runs_n, runs_len))
    peer = {k: _median_of(figures[f"dbos_{k}"], "per_step_ms" if k == "linear"
                          else "steps_per_s") for k in ("linear", "fan_out", "runs")}
    per_step = statistics.median(figures["linear"])
    bench.results["floor"] = {"transaction_pair_ms": txn * 1e3, "huey_chain_hop_ms": hop * 1e3}
    bench.results["dbos"] = {"interpreter": next((f.get("interpreter") for f in
                                                 figures["dbos_linear"]
                                                 if f.get("interpreter")), None),
                            "skipped": next((f["skipped"] for f in figures["dbos_linear"]
                                             if "skipped" in f), None), **peer}
    bench.results["linear"] = {
        "steps": linear_n, "rounds_ms_per_step": figures["linear"], "per_step_ms": per_step,
        "ratio_to_floor": per_step / (txn * 1e3),
        "ratio_to_huey_chain": per_step / (hop * 1e3),
        "ratio_to_dbos": per_step / peer["linear"] if peer["linear"] else None}
    for name, steps in (("fan_out", fan_n), ("runs", runs_n * runs_len)):
        rate = statistics.median(figures[name])
        bench.results[name] = {"steps": steps, "rounds_steps_per_s": figures[name],
                              "steps_per_s": rate,
                              "ratio_to_dbos": rate / peer[name] if peer[name] else None}
    bench.results["runs"]["shape"] = f"{runs_n} runs x {runs_len} steps"

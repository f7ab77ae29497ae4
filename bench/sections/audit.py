"""What the audit chain costs: chained steps and approvals with the chain on, as a ratio to
the same work with it off (the hashing replaced by nothing), in rounds that alternate so
that the machine's drift falls on both alike."""

from __future__ import annotations

import statistics
import time

from bench.plumbing import chain_spec


def measure(bench) -> None:
    from django.contrib.auth.models import Group, User

    from workflows import engine
    from workflows.engine import rows
    from workflows.specs.storage import store_spec
    from workflows.workers import worker

    n = bench.pick(40, 150, 400)
    steps = chain_spec("bench-audit-steps", n)
    gates = store_spec({"name": "bench-audit-gate", "steps": [
        {"key": "qa", "approval": {"group": "bench-audit"}}]})[0]
    approver, _ = User.objects.get_or_create(username="bench-audit-approver")
    approver.groups.add(Group.objects.get_or_create(name="bench-audit")[0])

    def steps_ms() -> float:
        engine.open_run(steps)
        began = time.perf_counter()
        while worker.work(budget=120):
            pass
        return (time.perf_counter() - began) / n * 1e3

    def approvals_ms() -> float:
        runs = [engine.open_run(gates).run for _ in range(n)]
        began = time.perf_counter()
        for run in runs:
            engine.approve(run, "qa", user=approver)
        return (time.perf_counter() - began) / n * 1e3

    real = rows.chain.link
    timings = {(what, on): [] for what in ("step", "approval") for on in (True, False)}
    steps_ms(), approvals_ms()  # warm
    try:
        for round_ in range(10):  # on, off, on, off...: each pair's ratio
            on = round_ % 2 == 0
            rows.chain.link = real if on else (lambda prev, fields: "")
            timings["step", on].append(steps_ms())
            timings["approval", on].append(approvals_ms())
    finally:
        rows.chain.link = real
    # The hashing alone, over a checkpoint as a transition writes it.
    from workflows.audit import chain
    from workflows.models import Checkpoint

    fields = {name: getattr(Checkpoint.objects.filter(run__spec=gates).last(), name)
              for name in chain.FIELDS}
    began, count = time.perf_counter(), 2000
    for _ in range(count):
        real("0" * 64, fields)
    bench.results["audit"] = {
        "per_round": n,
        "step_ms": {"chain": statistics.median(timings["step", True]),
                    "off": statistics.median(timings["step", False])},
        "approval_ms": {"chain": statistics.median(timings["approval", True]),
                        "off": statistics.median(timings["approval", False])},
        "step_ratio": paired(timings["step", True], timings["step", False]),
        "approval_ratio": paired(timings["approval", True], timings["approval", False]),
        "hash_us_per_checkpoint": (time.perf_counter() - began) / count * 1e6}


def paired(on: list[float], off: list[float]) -> float:
    """The median of each round's time with the chain over the next round's without."""
    return statistics.median(a / b for a, b in zip(on, off, strict=True))

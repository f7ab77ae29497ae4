"""What the audit chain costs: chained steps and approvals with the chain on, as a ratio to
the same work with it off (the hashing replaced by nothing). On and off alternate run by
run (on, off, off, on, ...), each timed alone, and the medians are compared: the drift of
the machine and of a growing database, which swamps a cost of a few per cent when whole
rounds are compared, falls on both sides alike."""

from __future__ import annotations

import statistics
import time

from bench.plumbing import chain_spec

STEPS_PER_RUN = 10


def measure(bench) -> None:
    from django.contrib.auth.models import Group, User

    from workflows import engine
    from workflows.audit import chain
    from workflows.engine import rows
    from workflows.models import Checkpoint
    from workflows.specs.storage import store_spec
    from workflows.workers import worker

    n = bench.pick(40, 200, 600)
    steps = chain_spec("bench-audit-steps", STEPS_PER_RUN)
    gates = store_spec({"name": "bench-audit-gate", "steps": [
        {"key": "qa", "approval": {"group": "bench-audit"}}]})[0]
    approver, _ = User.objects.get_or_create(username="bench-audit-approver")
    approver.groups.add(Group.objects.get_or_create(name="bench-audit")[0])
    real = rows.chain.link

    def timed(work, count: int) -> dict[bool, list[float]]:
        """ms of each of `count` pieces of work, by whether the chain was on for it."""
        took = {True: [], False: []}
        try:
            for i in range(count):
                on = i % 4 in (0, 3)
                rows.chain.link = real if on else (lambda prev, fields: "")
                took[on].append(work())
        finally:
            rows.chain.link = real
        return took

    def a_run_of_steps() -> float:
        engine.open_run(steps)
        began = time.perf_counter()
        while worker.work(budget=STEPS_PER_RUN + 2):
            pass
        return (time.perf_counter() - began) / STEPS_PER_RUN * 1e3

    waiting = [engine.open_run(gates).run for _ in range(n)]

    def an_approval() -> float:
        run = waiting.pop()
        began = time.perf_counter()
        engine.approve(run, "qa", user=approver)
        return (time.perf_counter() - began) * 1e3

    timed(a_run_of_steps, 8), timed(an_approval, 8)  # warm
    step = timed(a_run_of_steps, n // 4)
    approval = timed(an_approval, n - 8)
    # The hashing alone, over a checkpoint as a transition writes it.
    fields = {name: getattr(Checkpoint.objects.filter(run__spec=gates).last(), name)
              for name in chain.FIELDS}
    began, count = time.perf_counter(), 2000
    for _ in range(count):
        real("0" * 64, fields)
    medians = {what: {"chain": statistics.median(took[True]),
                      "off": statistics.median(took[False])}
               for what, took in (("step", step), ("approval", approval))}
    bench.results["audit"] = {
        "steps_timed": len(step[True]) + len(step[False]),
        "approvals_timed": len(approval[True]) + len(approval[False]),
        "step_ms": medians["step"], "approval_ms": medians["approval"],
        "step_ratio": medians["step"]["chain"] / medians["step"]["off"],
        "approval_ratio": medians["approval"]["chain"] / medians["approval"]["off"],
        "hash_us_per_checkpoint": (time.perf_counter() - began) / count * 1e6}

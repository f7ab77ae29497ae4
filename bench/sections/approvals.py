"""Approve to next step: how long from a decision to the next step's start."""

from __future__ import annotations

import time

from bench.plumbing import gate_spec
from tests.support.stats import summary


def measure(bench) -> None:
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
    for _ in range(1 + bench.pick(5, 15, 40)):
        run = engine.open_run(spec).run
        time.sleep(0.1)  # workers idle again, as a person's press finds them
        pressed = timezone.now()
        shown = run.steps.get(key="gate").evidence_digest  # as the page renders it
        response = client.post(f"/runs/{run.pk}/steps/gate/approve/",
                               {"evidence_digest": shown}, HTTP_HX_REQUEST="true")
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
    bench.results["approval_round_trip_ms"] = {
        **summary(latencies[1:]), "target_median_ms": 25, "target_p95_ms": 60,
        "first_cold_ms": latencies[0], "each": [round(x, 1) for x in latencies[1:]]}

"""Bytes per finished run."""

from __future__ import annotations

from bench.plumbing import analyze, database_bytes


def measure(bench) -> None:
    """Bytes a finished run costs on disk: the database's size before and after runs of
    a five-step spec with a gate (tables and indexes; SQLite's pages in use)."""
    from django.contrib.auth.models import Group, User

    from workflows import engine
    from workflows.models import Checkpoint, Run
    from workflows.specs.storage import store_spec
    from workflows.workers import worker

    n = bench.pick(20, 100, 500)
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
    bench.results["storage"] = {
        "runs": n, "steps_per_run": 5, "bytes_per_run": grown / n,
        "checkpoints_per_run": (Checkpoint.objects.count() - checkpoints) / n}

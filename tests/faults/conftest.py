"""The fault-injection suite: every fault is counted, every run checked, anomalies listed
(added up across parallel workers and printed by tests/conftest.py)."""

from __future__ import annotations

TALLY = {"faults injected": 0, "runs checked": 0, "overlapping attempts": 0, "results lost": 0,
         "compensations run twice": 0, "steps stuck": 0, "mails and webhooks lost": 0,
         "HTTP 500s": 0, "anomalies found": 0, "claims charged that never began": 0,
         "finished commands run again after a partition": 0,
         "results vanished without a stale result": 0}
ANOMALIES: list[str] = []


def check_run(run_id: int, allowed: tuple[str, ...] = ("completed",)) -> list[str]:
    """Invariants every run must keep after any fault; returns the anomalies found."""
    from workflows.models import Checkpoint, Run

    run = Run.objects.get(pk=run_id)
    found = []
    if run.status not in allowed:
        found.append(f"run {run_id} ended {run.status}, expected {' or '.join(allowed)}")
    seqs = list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    if seqs != list(range(1, len(seqs) + 1)):
        found.append(f"run {run_id}: checkpoint seq not gapless/unique ({len(seqs)} rows)")
    if run.checkpoint_seq != len(seqs):
        found.append(f"run {run_id}: run says {run.checkpoint_seq} checkpoints, has {len(seqs)}")
    done = list(Checkpoint.objects.filter(run=run, kind="step_completed")
                .values_list("step_id", flat=True))
    twice = {s for s in done if done.count(s) > 1}
    if twice:
        found.append(f"run {run_id}: {len(twice)} step(s) recorded completed twice")
    if run.status == "completed" and run.steps.exclude(status__in=["completed", "skipped"]
                                                       ).exclude(continue_on_failure=True
                                                                 ).exists():
        found.append(f"run {run_id}: completed with unfinished steps")
    from workflows.audit.verify import verify

    found += [f"run {run_id} seq {seq}: audit chain: {what}"
              for _, seq, what in verify([run_id]).problems]
    TALLY["runs checked"] += 1
    TALLY["anomalies found"] += len(found)
    ANOMALIES.extend(found)
    return found


def injected(count: int = 1) -> None:
    TALLY["faults injected"] += count

"""Verify every run's chain in the database (manage.py verify_audit), a chunk at a time."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models import Checkpoint, Run
from . import chain

CHUNK = 5000


@dataclass
class Verdict:
    runs: int = 0
    checkpoints: int = 0
    problems: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(run_ids=None) -> Verdict:
    """Check the chains of the given runs (every run by default): the first fault of each
    run whose chain does not verify, as (run id, seq, what)."""
    runs = Run.objects.order_by("pk")
    if run_ids is not None:
        runs = runs.filter(pk__in=run_ids)
    heads = dict(runs.values_list("pk", "chain_head"))
    verdict = Verdict(runs=len(heads))
    rows = Checkpoint.objects.filter(run_id__in=heads) if run_ids is not None \
        else Checkpoint.objects.all()
    rows = rows.order_by("run_id", "seq").values(*chain.FIELDS, "prev_hash", "hash")

    def counted():
        for row in rows.iterator(chunk_size=CHUNK):
            verdict.checkpoints += 1
            yield row

    verdict.problems = list(chain.problems(counted(), heads))
    return verdict

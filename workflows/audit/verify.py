"""Verify every run's chain in the database, the seals over them and the timestamps over
the seals (manage.py verify_audit), a chunk at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from workflows.audit import chain, seals, timestamps
from workflows.models import Approval, AuditSeal, AuditTimestamp, Checkpoint, CheckpointKind, Run
from workflows.timing import clock

CHUNK = 5000


@dataclass
class Verdict:
    runs: int = 0
    checkpoints: int = 0
    seals: int = 0
    timestamps: int = 0
    decisions: int = 0
    # Decisions recorded before their checkpoints carried their digest: the chain does not
    # cover them (the verdict says how many).
    uncovered: int = 0
    problems: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(run_ids=None) -> Verdict:
    """Check the chains of the given runs (every run by default), then the seals over them:
    the first fault of each run whose chain does not verify, and each seal that does not
    hold, as (run id, seq, what)."""
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
    verdict.problems += _decision_problems(verdict, runs if run_ids is not None else None)
    verdict.problems += _seal_problems(verdict, run_ids)
    verdict.problems += _unsealed_problems(runs)
    verdict.problems += _trigger_problems()
    if run_ids is None:  # the timestamps vouch for the whole seal chain, not for one run
        verdict.problems += _timestamp_problems(verdict)
    return verdict


def _timestamp_problems(verdict: Verdict) -> list[tuple[int, int, str]]:
    """Each timestamp's answer holds and its seal is still in the chain."""
    digests = list(AuditTimestamp.objects.values_list("seal_digest", flat=True))
    verdict.timestamps = len(digests)
    if digests and not settings.TOLLGATE_AUDIT_TSA_CA_FILE:
        return [(0, 0, "the seal chain has timestamps, and no TOLLGATE_AUDIT_TSA_CA_FILE "
                       "to check them with")]
    sealed = {}
    for start in range(0, len(digests), CHUNK):
        sealed.update((row.digest, row) for row in AuditSeal.objects.filter(
            digest__in=digests[start:start + CHUNK]))
    return list(timestamps.problems(sealed))


def _seal_problems(verdict: Verdict, run_ids) -> list[tuple[int, int, str]]:
    """Every seal is checked (they are one chain); only those of `run_ids` are reported."""
    pruned = set(AuditSeal.objects.filter(seq=0).values_list("run_id", flat=True))
    known: dict[tuple[int, int], str] = {}

    def hash_at(run_id: int, seq: int) -> str | None:
        return known.get((run_id, seq))

    def batches():
        batch = []
        for row in AuditSeal.objects.order_by("pk").iterator(chunk_size=CHUNK):
            batch.append(row)
            if len(batch) == CHUNK:
                yield batch
                batch = []
        yield batch

    found = []
    if not AuditSeal.objects.exists():
        return found
    try:
        public = seals.public_key()  # never the private key: checking needs only this
    except (LookupError, OSError, ValueError) as exc:
        return [(0, 0, f"the seals cannot be checked: {exc}")]
    for batch in batches():
        known.clear()
        wanted = {row.run_id for row in batch if row.seq}
        for run_id, seq, hash_ in Checkpoint.objects.filter(
                run_id__in=wanted, seq__in={row.seq for row in batch if row.seq}
        ).values_list("run_id", "seq", "hash").iterator(chunk_size=CHUNK):
            known[run_id, seq] = hash_
        gone = wanted - set(Run.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        for row in batch:
            if row.seq and (row.run_id, row.seq) not in known and row.run_id not in gone:
                known[row.run_id, row.seq] = ""  # the run is there, that checkpoint is not
        verdict.seals += len(batch)
        found += [problem for problem in seals.problems(batch, hash_at, public, pruned)
                  if run_ids is None or problem[0] in run_ids]
    return found


DECISION_KINDS = (CheckpointKind.APPROVAL_RECORDED, CheckpointKind.STEP_APPROVED,
                  CheckpointKind.REJECTION_RECORDED, CheckpointKind.STEP_REJECTED)


def _decision_problems(verdict: Verdict, runs) -> list[tuple[int, int, str]]:
    """Each decision row is the one its checkpoint's digest vouches for, and each decision
    a checkpoint records still has its row: a row changed, added or deleted behind the
    application's back is named by the run and the checkpoint (or 0 for a row the chain
    does not know)."""
    checkpoints = Checkpoint.objects.filter(kind__in=DECISION_KINDS)
    rows = Approval.objects.all()
    if runs is not None:
        checkpoints = checkpoints.filter(run__in=runs)
        rows = rows.filter(step__run__in=runs)
    vouched: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
    chained_runs = set()
    for run_id, seq, step_id, evidence in checkpoints.values_list(
            "run_id", "seq", "step_id", "evidence").iterator(chunk_size=CHUNK):
        if decision := chain.recorded_decision(evidence):
            chained_runs.add(run_id)
            vouched.setdefault((step_id, decision.get("user")), {})[
                decision.get("digest")] = (run_id, seq)
    found = []
    for row in rows.values(*chain.DECISION_FIELDS, "step__run_id").iterator(chunk_size=CHUNK):
        verdict.decisions += 1
        run_id = row["step__run_id"]
        mine = vouched.get((row["step_id"], row["user_id"]), {})
        if mine.pop(chain.decision_digest(row), None) is not None:
            continue
        if run_id not in chained_runs:
            verdict.uncovered += 1  # decided before decisions were chained
        elif mine:
            found.append((run_id, next(iter(mine.values()))[1], "a decision differs from what "
                          "its checkpoint recorded (changed after it was written)"))
            mine.clear()
        else:
            found.append((run_id, 0, f"a decision of user {row['user_id']} on step "
                          f"{row['step_id']} that no checkpoint records (added behind the "
                          "application's back)"))
    for digests in vouched.values():
        for run_id, seq in digests.values():
            found.append((run_id, seq, "the decision this checkpoint records is gone"))
    return found


def _unsealed_problems(runs) -> list[tuple[int, int, str]]:
    """Runs that must have a seal over their last checkpoint by now (it moved more than two
    seal periods ago) and have none: their seals were removed, or no sealer runs."""
    due = clock.database_now() - timedelta(
        seconds=2 * settings.TOLLGATE_AUDIT_SEAL_SECONDS) - seals.MARGIN
    late = seals.unsealed(runs.filter(updated_at__lt=due))
    return [(run_id, seq, f"its chain stands unsealed at seq {seq} since {chain.moment(at)} "
                          f"(last sealed at seq {last or 'none'}): its seals were removed, "
                          "or no sealer runs")
            for run_id, seq, at, last in late.values_list(
                "pk", "checkpoint_seq", "updated_at", "sealed_seq").iterator(chunk_size=CHUNK)]


# The database's own refusals (migrations 0044, 0050, 0051, 0058): one missing or disabled
# is said, though what it would have refused is found by the chain all the same.
TRIGGERS = {
    "postgresql": ["workflows_checkpoint_append_only", "workflows_auditseal_append_only",
                   "workflows_audittimestamp_append_only", "workflows_approval_append_only"],
    "sqlite": ["workflows_checkpoint_append_only", "workflows_auditseal_append_only",
               "workflows_audittimestamp_append_only", "workflows_checkpoint_no_delete",
               "workflows_auditseal_no_delete", "workflows_audittimestamp_no_delete",
               "workflows_approval_append_only", "workflows_approval_no_delete"],
}


def _trigger_problems() -> list[tuple[int, int, str]]:
    from django.db import connection

    wanted = TRIGGERS.get(connection.vendor, [])
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
                           "AND tgenabled <> 'D'")
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        present = {name for (name,) in cursor.fetchall()}
    return [(0, 0, f"the database's trigger {name} is missing or disabled: it no longer "
                   "refuses changes to the audit trail itself") for name in wanted
            if name not in present]

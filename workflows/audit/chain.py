"""The hash of a checkpoint: SHA-256 over a canonical form of its fields and the hash of the
one before it in its run. Python's standard library only: the offline verifier of an
export (scripts/verify-audit-export) imports this module without Django."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

# What a checkpoint's hash covers: every field of it but its row id.
FIELDS = ("run_id", "seq", "kind", "step_id", "run_status", "step_status", "actor_id",
          "actor_name", "label", "summary", "evidence", "state_patch", "at")


def moment(at: datetime | str) -> str:
    """A time as the chain writes it: UTC, to the microsecond."""
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def canonical(fields: dict) -> bytes:
    """The fields as one JSON text: keys sorted, no spaces, UTF-8, times in UTC."""
    values = {name: moment(fields[name]) if name == "at" else fields[name] for name in FIELDS}
    return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def digest(value) -> str:
    """SHA-256 of any JSON value in the same canonical form (keys sorted, no spaces,
    UTF-8; what JSON cannot hold, as text): what a signature or a gate's evidence digest
    covers."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False, default=str).encode()).hexdigest()


# What a decision's checkpoint vouches for of its row (workflows_approval): every field that
# says who decided what, on which evidence, how and when. The checkpoint's evidence carries
# {"decision": {"user": id, "digest": decision_digest(row)}}, so the chain covers the row.
DECISION_FIELDS = ("step_id", "attempt", "user_id", "decision", "comment", "values", "group",
                   "at", "channel", "chat_identity", "rule_id", "on_behalf_of_id",
                   "signature_meaning", "signature_method", "signer_name", "signature_digest",
                   "evidence_digest")


def state_after(state: dict, patch, evidence) -> dict:
    """The run's shared state after a checkpoint, from the state before it: its patch merged,
    or (a report that replaced the state) its patch alone."""
    if isinstance(evidence, dict) and evidence.get("shared_state_replaced"):
        return dict(patch or {})
    return {**state, **(patch or {})}


def recorded_decision(evidence) -> dict | None:
    """What a checkpoint records of the decision it was written for ({"user", "digest"}),
    or None (not a decision's checkpoint, or one written before decisions were chained)."""
    decision = evidence.get("decision") if isinstance(evidence, dict) else None
    return decision if isinstance(decision, dict) else None


def decision_digest(fields: dict) -> str:
    """SHA-256 of a decision's DECISION_FIELDS (times in UTC, to the microsecond)."""
    return digest({name: moment(fields[name]) if name == "at" else fields[name]
                   for name in DECISION_FIELDS})


def link(prev_hash: str, fields: dict) -> str:
    """The hash of a checkpoint with these fields, after one whose hash is `prev_hash` ("" for
    a run's first)."""
    return hashlib.sha256(prev_hash.encode() + b"\n" + canonical(fields)).hexdigest()


def problems(rows, heads: dict | None = None):
    """Check chains: `rows` are dicts with FIELDS, `prev_hash` and `hash`, ordered by run and
    seq. Yields (run_id, seq, what is wrong) for the first fault of each run; `heads`
    ({run_id: the hash its run row names last}) finds checkpoints cut off a run's end."""
    run_id, prev, seq, broken = None, "", 0, False
    seen = set()

    def ended(run_id, prev, seq):
        if heads is not None and run_id in heads and heads[run_id] != prev:
            return (run_id, seq + 1, "the run's last hash is not its last checkpoint's: "
                    f"checkpoints after seq {seq} are missing or were changed")
        return None

    for row in rows:
        if row["run_id"] != run_id:
            if run_id is not None and not broken and (end := ended(run_id, prev, seq)):
                yield end
            run_id, prev, seq, broken = row["run_id"], "", 0, False
            seen.add(run_id)
        if broken:
            continue
        if row["seq"] != seq + 1:
            broken = True
            yield (run_id, seq + 1, f"seq {seq + 1} is missing (next is {row['seq']})")
        elif row["prev_hash"] != prev:
            broken = True
            yield (run_id, row["seq"], "it does not follow the checkpoint before it "
                   "(deleted, re-ordered or changed)")
        elif link(prev, row) != row["hash"]:
            broken = True
            yield (run_id, row["seq"], "its fields do not match its hash (changed after it "
                   "was written)")
        prev, seq = row["hash"], row["seq"]
    if run_id is not None and not broken and (end := ended(run_id, prev, seq)):
        yield end
    for missing in sorted(set(heads or {}) - seen):
        if heads[missing]:
            yield (missing, 1, "the run names a last hash but has no checkpoints")


def seal_payload(run_id: int, seq: int, hash_: str, at, prev: str) -> bytes:
    """What a seal signs (workflows.audit.seals): checkpoint `seq` of the run had `hash_` at
    `at`, after the seal whose digest is `prev`."""
    return json.dumps({"run_id": run_id, "seq": seq, "hash": hash_, "at": moment(at),
                       "prev": prev}, sort_keys=True, separators=(",", ":")).encode()


def window_problem(rows, head: str, decisions=()) -> str:
    """The first fault in the latest checkpoints of a run (dicts with FIELDS, `prev_hash` and
    `hash`, oldest first, ending with the run's last; `head` the hash the run names last),
    and in the decisions their checkpoints record (dicts with DECISION_FIELDS): what a page
    already holds, checked without reading more. "" when they hold. verify_audit checks the
    whole chain and its seals."""
    rows = list(rows)
    for before, row in zip([None, *rows], rows, strict=False):
        if link(row["prev_hash"], row) != row["hash"]:
            return f"checkpoint {row['seq']} does not match its hash (changed after it was written)"
        if before is not None and row["prev_hash"] != before["hash"]:
            return f"checkpoint {row['seq']} does not follow the one before it"
    if rows and rows[-1]["hash"] != head:
        return f"checkpoints after {rows[-1]['seq']} are missing or were changed"
    vouched = {(row.get("step_id"), decision.get("user")): decision.get("digest")
               for row in rows if (decision := recorded_decision(row.get("evidence")))}
    for decision in decisions:
        key = (decision["step_id"], decision["user_id"])
        if key in vouched and vouched[key] != decision_digest(decision):
            return (f"a decision on step {decision['step_id']} differs from what its checkpoint "
                    "recorded")
    return ""

"""Seals: the deployment's key (Ed25519) signs where each run's chain stood, every
TOLLGATE_AUDIT_SEAL_SECONDS and when a run is pruned. The chain alone finds a row changed
by someone who did not recompute the hashes after it; a seal finds the one who did, as far
back as the run's last seal. The key: TOLLGATE_AUDIT_KEY_FILE (a PKCS#8 PEM file), made in
var/ on first use when unset; its public half is at /audit/key and in every run's export."""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, OuterRef, Q, Subquery

from tollgate.secret_files import made_once
from workflows.audit import chain
from workflows.models import OPEN_RUN_STATUSES, AuditSeal, Run
from workflows.timing import clock

# A run that finished this long before the last seal is still looked at: a transaction
# that wrote it may have committed after that seal read the runs.
MARGIN = timedelta(minutes=5)
CATCH_UP = timedelta(days=1)


def private_key() -> Ed25519PrivateKey:
    """The key that signs seals, read by the sealer alone (the consumers' periodic seal,
    retention's tombstones): made on first use where it is missing, with its public half
    written beside it (public_key), which is all that checking a seal needs."""
    return _private_key(settings.TOLLGATE_AUDIT_KEY_FILE)


@cache
def _private_key(where: str) -> Ed25519PrivateKey:
    path = Path(where)
    key = serialization.load_pem_private_key(made_once(path, lambda: (
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 private key")
    _write_public(key.public_key())
    return key


def public_path() -> Path:
    return Path(settings.TOLLGATE_AUDIT_PUBLIC_KEY_FILE
                or f"{settings.TOLLGATE_AUDIT_KEY_FILE}.pub")


def _write_public(public: Ed25519PublicKey) -> None:
    path = public_path()
    if path.exists():
        return
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_bytes(pem)
    draft.replace(path)


def public_key() -> Ed25519PublicKey:
    """The key seals are checked with: TOLLGATE_AUDIT_PUBLIC_KEY_FILE (by default the
    signing key's path with ".pub"), which the sealer writes beside its key. The web server
    and the verifier read only this; where it is missing beside a key made by an earlier
    version, it is derived once. LookupError when there is no key yet (nothing sealed)."""
    path = public_path()
    if not path.exists():
        if not Path(settings.TOLLGATE_AUDIT_KEY_FILE).exists():
            raise LookupError(f"No audit key yet: neither {path} nor "
                              f"{settings.TOLLGATE_AUDIT_KEY_FILE} exists (nothing was sealed).")
        private_key()
    key = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} holds no Ed25519 public key")
    return key


def public_pem() -> str:
    """The public key as PEM text ("" when nothing was sealed yet)."""
    try:
        key = public_key()
    except LookupError:
        return ""
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _append(entries: list[tuple[int, int, str]]) -> int:
    """Seal (run id, seq, hash) entries after the newest seal, in one transaction."""
    if not entries:
        return 0
    key = private_key()
    kid = key_id(key.public_key())
    with transaction.atomic():
        last = AuditSeal.objects.select_for_update().order_by("-pk").first()
        prev, now, rows = (last.digest if last else ""), clock.database_now(), []
        for run_id, seq, hash_ in entries:
            signed = chain.seal_payload(run_id, seq, hash_, now, prev)
            digest = hashlib.sha256(signed).hexdigest()
            rows.append(AuditSeal(run_id=run_id, seq=seq, hash=hash_, at=now, prev=prev,
                                  digest=digest, signature=key.sign(signed).hex(), key_id=kid))
            prev = digest
        AuditSeal.objects.bulk_create(rows)
    return len(rows)


def unsealed(runs):
    """Those of `runs` whose chain moved since their last seal (or that have none)."""
    sealed = AuditSeal.objects.filter(run_id=OuterRef("pk")).order_by("-seq")
    return (runs.exclude(chain_head="")
            .annotate(sealed=Subquery(sealed.values("hash")[:1]),
                      sealed_seq=Subquery(sealed.values("seq")[:1]))
            .filter(Q(sealed__isnull=True) | ~Q(sealed=F("chain_head"))))


def seal(limit: int = 5000) -> int:
    """Seal every run whose chain moved since its last seal (open runs, and runs finished
    since the last seal); how many were sealed. A sealer racing another loses (the seal
    chain's `prev` is unique) and seals nothing this time."""
    # Since the last seal of a run's chain (retention's tombstones say nothing of the runs
    # that stay), and never less than a day back: a run that moved after it finished (a
    # compensation, a transaction that committed late) is sealed at the next pass.
    last = (AuditSeal.objects.filter(seq__gt=0).order_by("-pk")
            .values_list("at", flat=True).first())
    runs = Run.objects.all()
    if last is not None:
        since = min(last - MARGIN, clock.database_now() - CATCH_UP)
        runs = runs.filter(Q(status__in=OPEN_RUN_STATUSES) | Q(finished_at__gte=since))
    moved = (unsealed(runs).order_by("pk")
             .values_list("pk", "checkpoint_seq", "chain_head")[:limit])
    try:
        return _append(list(moved))
    except IntegrityError:
        return 0


def seal_pruned(runs: list[tuple[int, str]]) -> None:
    """Tombstones for runs deleted by retention (run id, last hash), in its transaction."""
    _append([(run_id, 0, head) for run_id, head in runs])


def problems(seals, hash_at, public: Ed25519PublicKey, pruned: set[int]):
    """Check seals in order: each signed by `public`, following the one before it, and
    naming a checkpoint that still has that hash (`hash_at(run_id, seq)`: its hash, or None
    if the run is gone; `pruned`: the runs with a tombstone, themselves checked here as
    they come). Yields (run id, seq, what is wrong)."""
    kid, prev = key_id(public), ""
    for row in seals:
        signed = chain.seal_payload(row.run_id, row.seq, row.hash, row.at, row.prev)
        if row.prev != prev:
            yield (row.run_id, row.seq, f"seal {row.pk}: a seal before it is missing")
        prev = row.digest
        if row.key_id != kid or hashlib.sha256(signed).hexdigest() != row.digest:
            yield (row.run_id, row.seq, f"seal {row.pk}: it is not what was signed")
            continue
        try:
            public.verify(bytes.fromhex(row.signature), signed)
        except Exception:  # InvalidSignature, or a signature that is not hex
            yield (row.run_id, row.seq, f"seal {row.pk}: its signature does not verify")
            continue
        if row.seq == 0:
            continue
        now = hash_at(row.run_id, row.seq)
        if now is None and row.run_id not in pruned:
            yield (row.run_id, row.seq, "the run is gone, and retention did not prune it")
        elif now is not None and now != row.hash:
            yield (row.run_id, row.seq, f"it differs from what was sealed at "
                   f"{chain.moment(row.at)} (the chain was rewritten)")

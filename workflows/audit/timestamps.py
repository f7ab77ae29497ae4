"""RFC 3161 timestamps of the seal chain (rfc3161-client): after sealing, the newest seal's
digest is sent to an outside timestamp authority (TOLLGATE_AUDIT_TSA_URL), whose signed
answer says that digest existed then. Each seal names the one before it, so one timestamp
vouches for the whole seal chain up to it: someone holding the deployment's key who rewrites
history and re-signs the seals can no longer make the chain match what the authority saw.
Answers must chain to the roots in TOLLGATE_AUDIT_TSA_CA_FILE."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import requests
from cryptography import x509
from django.conf import settings
from rfc3161_client import (
    HashAlgorithm,
    PKIStatus,
    TimestampRequestBuilder,
    VerificationError,
    VerifierBuilder,
    decode_timestamp_response,
)

from ..models import AuditSeal, AuditTimestamp

TIMEOUT_SECONDS = 10


class NotStamped(Exception):
    """The authority did not give a timestamp that holds (said why)."""


def enabled() -> bool:
    return bool(settings.TOLLGATE_AUDIT_TSA_URL)


@cache
def _roots(path: str) -> tuple[x509.Certificate, ...]:
    return tuple(x509.load_pem_x509_certificates(Path(path).read_bytes()))


def _problem(token: bytes, seal_digest: str, nonce: int | None = None) -> str:
    """What is wrong with an authority's answer for this seal digest ("" if nothing)."""
    try:
        response = decode_timestamp_response(token)
    except ValueError:
        return "it is not a timestamp authority's answer"
    if response.status != PKIStatus.GRANTED:
        return f"the authority refused it ({response.status_string or response.status})"
    imprint = response.tst_info.message_imprint.message
    wanted = hashlib.sha256(seal_digest.encode()).digest()
    if imprint != wanted:
        return "it timestamps something other than this seal"
    builder = VerifierBuilder(roots=list(_roots(settings.TOLLGATE_AUDIT_TSA_CA_FILE)))
    if nonce is not None:
        builder = builder.nonce(nonce)
    try:
        builder.build().verify(response, wanted)
    except VerificationError as exc:
        return f"the authority's signature does not verify ({exc})"
    return ""


def stamp() -> AuditTimestamp | None:
    """Timestamp the newest seal, if it has no timestamp yet. NotStamped (nothing kept)
    when the authority cannot be reached or its answer does not hold."""
    newest = AuditSeal.objects.order_by("-pk").first()
    if newest is None or AuditTimestamp.objects.filter(seal_digest=newest.digest).exists():
        return None
    request = TimestampRequestBuilder(data=newest.digest.encode(),
                                      hash_algorithm=HashAlgorithm.SHA256).build()
    url = settings.TOLLGATE_AUDIT_TSA_URL
    try:
        answer = requests.post(url, data=request.as_bytes(), timeout=TIMEOUT_SECONDS,
                               headers={"Content-Type": "application/timestamp-query"})
        answer.raise_for_status()
    except requests.RequestException as exc:
        raise NotStamped(f"The timestamp authority at {url} did not answer: {exc}") from None
    if problem := _problem(answer.content, newest.digest, request.nonce):
        raise NotStamped(f"The timestamp authority at {url} answered, but {problem}.")
    at = decode_timestamp_response(answer.content).tst_info.gen_time
    stamped, _ = AuditTimestamp.objects.get_or_create(
        seal_digest=newest.digest,
        defaults={"seal_id": newest.pk, "at": at, "token": answer.content, "authority": url})
    return stamped


def problems(seal_at: dict[str, object]):
    """Check every timestamp: the authority's answer holds, and the seal it vouches for is
    still in the chain with that digest (`seal_at`: seal digest -> its row). Yields (run id,
    seq, what is wrong), named by the seal's run and seq (0, 0 when the seal is gone)."""
    for row in AuditTimestamp.objects.order_by("seal_id").iterator():
        sealed = seal_at.get(row.seal_digest)
        when = f"timestamp of {row.at:%Y-%m-%d %H:%M:%S}"
        if sealed is None:
            yield (0, 0, f"{when}: the seal it vouches for is no longer in the chain (the "
                         "seals were rewritten)")
        elif problem := _problem(bytes(row.token), row.seal_digest):
            yield (sealed.run_id, sealed.seq, f"{when}: {problem}")

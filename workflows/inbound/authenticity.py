"""Whom a message is vouched for: the domains for which its From header is authenticated.

A domain counts when a DKIM signature of it verifies over the From header and the whole
body (dkimpy; a signature that covers only part of the body, `l=`, counts for nothing), or
when a relay the deployment trusts (TOLLGATE_INBOUND_TRUSTED_RELAYS, by the authserv-id of
its Authentication-Results header) says DKIM or DMARC passed for it. Such a relay must remove
headers bearing its name from what it receives (RFC 8601, section 5): that is the trust."""

from __future__ import annotations

import logging
from email.message import EmailMessage
from email.utils import getaddresses

import authres
import dkim
from django.conf import settings
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)


def sender(message: EmailMessage) -> str:
    """The one address of the one From header, lower case; "" when there is not exactly one
    (a second From header is how a forged sender hides beside a signed one)."""
    headers = message.get_all("From") or []
    addresses = getaddresses(headers) if len(headers) == 1 else []
    if len(addresses) != 1 or "@" not in addresses[0][1]:
        return ""
    return addresses[0][1].strip().lower()


def aligned(domain: str, vouched: set[str]) -> bool:
    """Whether an address's domain is a vouched domain or under one: a signature of
    example.com vouches for an address at mail.example.com, never the other way."""
    return any(domain == d or domain.endswith(f".{d}") for d in vouched)


def _dns():
    return import_string(settings.TOLLGATE_DKIM_DNS) if settings.TOLLGATE_DKIM_DNS else None


def dkim_domains(raw: bytes) -> set[str]:
    """The domains whose DKIM signatures on this message verify, over its From header and
    its whole body."""
    checker = dkim.DKIM(raw, minkey=1024)
    dns = _dns()
    found = set()
    count = sum(1 for name, _ in checker.headers if name.lower() == b"dkim-signature")
    for idx in range(count):
        try:
            verified = (checker.verify(idx=idx, dnsfunc=dns) if dns else
                        checker.verify(idx=idx))
        except dkim.DKIMException as exc:
            log.info("A DKIM signature did not verify: %s", exc)
            continue
        fields = checker.signature_fields or {}
        if verified and b"l" not in fields and b"from" in checker.include_headers:
            found.add(checker.domain.decode("ascii", "replace").lower())
    return found


def relay_domains(message: EmailMessage) -> set[str]:
    """The domains a trusted relay's Authentication-Results say passed DKIM or DMARC."""
    trusted = set(settings.TOLLGATE_INBOUND_TRUSTED_RELAYS)
    if not trusted:
        return set()
    found = set()
    for value in message.get_all("Authentication-Results") or []:
        try:
            header = authres.AuthenticationResultsHeader.parse_value(str(value))
        except authres.AuthResError:
            continue
        if str(header.authserv_id).lower() not in trusted:
            continue
        for result in header.results:
            if str(result.result).lower() != "pass":
                continue
            for prop in result.properties:
                if ((result.method == "dkim" and prop.type == "header" and prop.name == "d")
                        or (result.method == "dmarc" and prop.type == "header"
                            and prop.name == "from")):
                    found.add(str(prop.value).lower())
    return found


def vouched_domains(raw: bytes, message: EmailMessage) -> set[str]:
    """Every domain this message is authenticated for (DKIM, and trusted relays)."""
    return dkim_domains(raw) | relay_domains(message)

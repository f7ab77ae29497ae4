"""Absolute links for mail and webhooks, the signed decision link a person gets by mail, and
the signed address their reply to it goes to.

A decision link names one person, one gate and one attempt of it (signed with
`django.core.signing`, so it cannot be forged or altered). Opening it shows the gate with
its evidence; it never decides anything by itself, and it stops working once the gate is
decided or a new attempt of it starts.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.urls import reverse
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.http import base36_to_int, int_to_base36

SALT = "tollgate.decide"


def absolute(path: str) -> str:
    """The path on TOLLGATE_BASE_URL (the path alone when it is not set)."""
    return f"{settings.TOLLGATE_BASE_URL}{path}"


def decision_token(user, step) -> str:
    # The evidence digest the mail showed: its page says when the gate changed since.
    return signing.dumps({"u": user.pk, "s": step.pk, "a": step.attempt,
                          "e": step.evidence_digest[:16]}, salt=SALT, compress=True)


def decision_url(user, step) -> str:
    """The absolute link that opens this gate's decision page for this person."""
    return absolute(reverse("decide", args=[decision_token(user, step)]))


@dataclass(frozen=True)
class Link:
    user_id: int
    step_id: int
    attempt: int
    shown: str = ""  # the start of the evidence digest the mail was written with


class BadLink(ValueError):
    """A link that was altered, or that expired; the message says which."""


def read(token: str) -> Link:
    max_age = settings.TOLLGATE_DECISION_LINK_DAYS * 86400
    try:
        data = signing.loads(token, salt=SALT, max_age=max_age)
        return Link(int(data["u"]), int(data["s"]), int(data["a"]), str(data.get("e", "")))
    except signing.SignatureExpired:
        raise BadLink(f"This link expired: decision links work for "
                      f"{settings.TOLLGATE_DECISION_LINK_DAYS} days.") from None
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise BadLink("This link is not a Tollgate decision link (it may have been cut "
                      "short by a mail program).") from None


# A reply address names the same person, gate, attempt and evidence as a decision link, in a
# mailbox's local part: at most 64 characters (RFC 5321), and lower case throughout, because
# mail servers may fold its case. Its HMAC (130 bits, keyed by SECRET_KEY) cannot be forged.
REPLY_SALT = "tollgate.reply"
REPLY_PREFIX = "decide+"
REPLY_EVIDENCE = 12  # hex characters of the evidence digest the mail showed


@dataclass(frozen=True)
class ReplyTo:
    user_id: int
    step_id: int
    attempt: int
    shown: str
    token: str  # the local part's signed part, as one string: what a reply was addressed to


def _reply_mac(body: str) -> str:
    digest = salted_hmac(REPLY_SALT, body, algorithm="sha256").digest()
    return base64.b32encode(digest).decode().lower()[:26]


def reply_address(user, step) -> str:
    """The address this person's reply to this gate's mail goes to ("" when replies are off:
    no TOLLGATE_REPLY_DOMAIN)."""
    if not settings.TOLLGATE_REPLY_DOMAIN:
        return ""
    body = ".".join((int_to_base36(user.pk), int_to_base36(step.pk),
                     int_to_base36(step.attempt), step.evidence_digest[:REPLY_EVIDENCE]))
    return f"{REPLY_PREFIX}{body}.{_reply_mac(body)}@{settings.TOLLGATE_REPLY_DOMAIN}"


def read_reply_address(address: str) -> ReplyTo | None:
    """What a reply address names, or None when it is not one of ours, or was altered."""
    local, _, domain = address.strip().lower().rpartition("@")
    if domain != settings.TOLLGATE_REPLY_DOMAIN or not local.startswith(REPLY_PREFIX):
        return None
    body, _, mac = local[len(REPLY_PREFIX):].rpartition(".")
    if not constant_time_compare(mac, _reply_mac(body)):
        return None
    try:
        user, step, attempt, shown = body.split(".")
        return ReplyTo(base36_to_int(user), base36_to_int(step), base36_to_int(attempt),
                       shown, f"{body}.{mac}")
    except ValueError:
        return None


DIGEST_SALT = "tollgate.digest"
DIGEST_DAYS = 3  # a digest's "approve these together" link is for the days after it


def digest_url(user, gates) -> str:
    """The absolute link of a digest that opens the inbox with these gates ticked, for one
    press to approve them all; opening it decides nothing."""
    token = signing.dumps({"u": user.pk, "g": [gate.pk for gate in gates]}, salt=DIGEST_SALT,
                          compress=True)
    return absolute(f"{reverse('inbox')}?digest={token}")


def read_digest(token: str) -> tuple[int, list[int]]:
    """(the person, the gates) a digest link names; BadLink when altered or too old."""
    try:
        data = signing.loads(token, salt=DIGEST_SALT, max_age=DIGEST_DAYS * 86400)
        return int(data["u"]), [int(pk) for pk in data["g"]]
    except signing.SignatureExpired:
        raise BadLink(f"This digest's link expired: it works for {DIGEST_DAYS} days; the "
                      "gates that still wait on you are below.") from None
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise BadLink("This is not a Tollgate digest link (it may have been cut short by a "
                      "mail program); the gates that wait on you are below.") from None

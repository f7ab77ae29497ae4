"""Absolute links for mail and webhooks, and the signed decision link a person gets by mail.

A decision link names one person, one gate and one attempt of it (signed with
`django.core.signing`, so it cannot be forged or altered). Opening it shows the gate with
its evidence; it never decides anything by itself, and it stops working once the gate is
decided or a new attempt of it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.urls import reverse

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

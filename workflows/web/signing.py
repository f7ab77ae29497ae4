"""A signature at the moment of deciding, asked for by the page: the person's password,
re-entered and checked as a sign-in is (django-axes counts a wrong one and locks the account
out after TOLLGATE_LOGIN_FAILURES, as it would a sign-in), one of their passkeys signing
the very decision the form posts (workflows.web.passkeys), or a sign-in made again at the
company's provider for it (the decision waits in the session meanwhile, under an id that
only the round trip started from its own page, in the same browser, can sign)."""

from __future__ import annotations

import secrets
import time

from django.contrib.auth import authenticate
from django.urls import reverse

from workflows import engine
from workflows.people.sessions import FRESH_SIGN_IN
from workflows.web import passkeys

PENDING = "tollgate.signing.pending"  # {binding: a decision waiting for the provider's sign-in}
MAX_WAITING = 5
WAIT_SECONDS = 600  # a decision waits this long for its sign-in
KEPT_FIELDS = ("via", "comment", "evidence_digest", "view", "next")


def signature_from(request, run_id: int, key: str, decision: str) -> engine.Signature | None:
    """The signature a decision's form carries, or None when it carries none (the engine
    then refuses a gate that must be signed)."""
    assertion = request.POST.get("signature_passkey", "")
    if assertion:
        passkeys.verify_signature(request, run_id, key, decision, assertion)
        return engine.Signature(request.user.pk, "passkey")
    password = request.POST.get("signature_password", "")
    if not password:
        return None
    person = authenticate(request, username=request.user.get_username(), password=password)
    if person is None or person.pk != request.user.pk:
        raise engine.NotPermitted("That is not your password: nothing was decided. Wrong "
                                  "passwords count as failed sign-ins.")
    return engine.Signature(request.user.pk, "password")


def await_sign_on(request, run_id: int, key: str, decision: str) -> str:
    """Keep the decision the form posts until the person has signed in again at the
    company's provider, under an id of its own; where to send them: the page that shows
    what they are about to sign and starts the round trip for that decision alone."""
    if not request.user.sso_identities.exists():
        raise engine.NotPermitted("You do not sign in through the company's provider: sign "
                                  "with your password or a passkey.")
    if decision == "reject" and not request.POST.get("comment", "").strip():
        raise engine.InvalidInput("A comment is required to reject: nothing was decided.")
    fields = {name: value for name, value in request.POST.items()
              if name in KEPT_FIELDS or name.startswith("field_")}
    now = time.time()
    # A few may wait at once (two tabs); each is made only by the round trip started for it.
    waiting = {binding: entry for binding, entry in (request.session.get(PENDING) or {}).items()
               if isinstance(entry, dict) and now - entry.get("at", 0) <= WAIT_SECONDS}
    binding = secrets.token_urlsafe(16)
    waiting[binding] = {"run": run_id, "key": key, "decision": decision, "fields": fields,
                        "at": now}
    request.session[PENDING] = dict(list(waiting.items())[-MAX_WAITING:])
    return reverse("sign_confirm", args=[binding])


def waiting_decision(request, binding: str) -> dict:
    """The decision waiting under `binding` in this session, or NotPermitted."""
    waiting = (request.session.get(PENDING) or {}).get(binding)
    if not isinstance(waiting, dict) or time.time() - waiting["at"] > WAIT_SECONDS:
        raise engine.NotPermitted("No decision is waiting for a signature here (or it waited "
                                  "too long): decide again.")
    return waiting


def signed_on(request) -> tuple[dict, engine.Signature]:
    """The decision the provider's round trip was started for, and its signature, each used
    once. NotPermitted unless the provider vouched for this person, in this browser, with a
    sign-in made after the decision was asked for."""
    fresh = request.session.pop(FRESH_SIGN_IN, None)
    if not fresh and not request.session.get(PENDING):
        raise engine.NotPermitted("No decision is waiting for a signature (or it waited "
                                  "too long): decide again.")
    if not fresh or fresh.get("user") != request.user.pk:
        raise engine.NotPermitted("The company's provider did not vouch for you: nothing "
                                  "was decided.")
    pending = dict(request.session.get(PENDING) or {})
    waiting = pending.pop(fresh.get("purpose", ""), None)
    request.session[PENDING] = pending
    if not waiting or time.time() - waiting["at"] > WAIT_SECONDS:
        raise engine.NotPermitted("No decision is waiting for a signature (or it waited "
                                  "too long): decide again.")
    # The provider's clock and this one may differ a little; a sign-in older than the
    # decision by more was not made for it (a provider that ignored max_age=0).
    if fresh["auth_time"] < waiting["at"] - 30:
        raise engine.NotPermitted("The provider did not ask you to sign in again (its "
                                  "sign-in predates this decision): nothing was decided.")
    return waiting, engine.Signature(request.user.pk, "sign-on")

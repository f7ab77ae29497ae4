"""A signature at the moment of deciding, asked for by the page: the person's password,
re-entered and checked as a sign-in is (django-axes counts a wrong one and locks the account
out after TOLLGATE_LOGIN_FAILURES, as it would a sign-in), or one of their passkeys signing
the very decision the form posts (workflows.web.passkeys)."""

from __future__ import annotations

from django.contrib.auth import authenticate

from workflows import engine
from workflows.web import passkeys


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

"""Passkeys (WebAuthn, through py_webauthn): a person registers one on their profile, and a
gate that must be signed can then be signed with it instead of the password. The challenge
the authenticator signs is the digest of exactly what is being decided (run, step, attempt,
decision, comment, form values, the evidence digest the page showed) and a one-time nonce
kept in the session: an assertion made for one decision verifies for no other, and for that
one only once.

The relying party is the host the browser is on (checked by ALLOWED_HOSTS), or
TOLLGATE_PASSKEY_RP_ID; a passkey needs a host name, not an IP address (browsers refuse).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import secrets
import time
from urllib.parse import urlsplit

import webauthn
from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db import IntegrityError
from webauthn.helpers import exceptions as webauthn_errors
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from workflows.audit import chain
from workflows.errors import InvalidInput, NotFound, NotPermitted
from workflows.models import Passkey, Step
from workflows.people.sessions import SIGNED_IN_AT
from workflows.timing import clock
from workflows.web.forms import posted_values

REGISTERING = "tollgate.passkey.registering"
SIGNING = "tollgate.passkey.signing"  # + ":run:key:decision"


def relying_party(request) -> tuple[str, str]:
    """(RP ID, origin) for this request: the host the person's browser is on."""
    origin = f"{request.scheme}://{request.get_host()}"
    return settings.TOLLGATE_PASSKEY_RP_ID or urlsplit(origin).hostname, origin


def possible(request) -> bool:
    """Can a browser make a passkey here? Not on an IP address: an RP ID is a host name."""
    try:
        ipaddress.ip_address(relying_party(request)[0].strip("[]"))
    except ValueError:
        return True
    return False


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _credential(data: str) -> dict:
    try:
        credential = json.loads(data)
    except ValueError:
        credential = None
    if not isinstance(credential, dict) or not isinstance(credential.get("rawId"), str):
        raise InvalidInput("The passkey's answer is not a WebAuthn credential: nothing was "
                           "saved or decided.")
    return credential


# Registration -------------------------------------------------------------------------


def _freshly_signed_in(request, doing: str = "add") -> None:
    """Adding or removing a passkey needs a sign-in made moments ago (with the password or
    at the company's provider): a session cookie stolen or left open longer cannot enrol a
    key of its own and then sign as the person with it, nor take away the person's own."""
    signed_in = request.session.get(SIGNED_IN_AT, 0)
    if time.time() - signed_in > settings.TOLLGATE_PASSKEY_ENROL_SECONDS:
        raise NotPermitted(
            f"{'Adding' if doing == 'add' else 'Removing'} a passkey needs a sign-in in the "
            f"last {settings.TOLLGATE_PASSKEY_ENROL_SECONDS // 60} minutes: sign out, sign in "
            f"again, and {doing} it then.")


def remove(request, pk: int) -> Passkey:
    """Remove one of this person's passkeys (NotFound if it is not theirs)."""
    _freshly_signed_in(request, "remove")
    passkey = Passkey.objects.filter(pk=pk, user=request.user).first()
    if passkey is None:
        raise NotFound("No such passkey of yours.")
    passkey.delete()
    return passkey


def registration_options(request) -> str:
    """The options (JSON) for navigator.credentials.create; the challenge stays in the
    session until the answer comes back."""
    _freshly_signed_in(request)
    rp_id, _ = relying_party(request)
    user = request.user
    challenge = secrets.token_bytes(32)
    request.session[REGISTERING] = _b64(challenge)
    options = webauthn.generate_registration_options(
        rp_id=rp_id, rp_name="Tollgate", user_id=str(user.pk).encode(),
        user_name=user.get_username(),
        user_display_name=user.get_full_name() or user.get_username(), challenge=challenge,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED),
        exclude_credentials=[PublicKeyCredentialDescriptor(id=bytes(p.credential_id))
                             for p in user.passkeys.all()])
    return webauthn.options_to_json(options)


def register(request, name: str, data: str) -> Passkey:
    """Check the authenticator's answer to the session's challenge and keep its public key
    as a passkey of this person. InvalidInput (nothing saved) if it does not verify."""
    name = name.replace("\x00", "").strip()[:100]
    if not name:
        raise InvalidInput("Name the passkey (where it lives, such as “work laptop”): "
                           "nothing was saved.")
    _freshly_signed_in(request)
    challenge = request.session.pop(REGISTERING, None)
    if challenge is None:
        raise InvalidInput("No passkey was being added in this session: start again.")
    rp_id, origin = relying_party(request)
    try:
        verified = webauthn.verify_registration_response(
            credential=_credential(data), expected_challenge=_unb64(challenge),
            expected_rp_id=rp_id, expected_origin=origin, require_user_verification=True)
    except webauthn_errors.InvalidRegistrationResponse as exc:
        raise InvalidInput(f"The passkey did not verify ({exc}): nothing was saved.") from None
    transports = json.loads(data).get("response", {}).get("transports") or []
    try:
        return Passkey.objects.create(
            user=request.user, name=name, credential_id=verified.credential_id,
            public_key=verified.credential_public_key, sign_count=verified.sign_count,
            transports=[t for t in transports if isinstance(t, str)][:10])
    except IntegrityError:
        raise InvalidInput("That passkey is registered already.") from None


# Signing ------------------------------------------------------------------------------


def _decided(request, run_id: int, key: str, decision: str, nonce: bytes) -> bytes:
    """The challenge: what this form decides, as the engine will record it, and the nonce."""
    step = Step.objects.filter(run_id=run_id, key=key).only("attempt").first()
    decided = {"run": run_id, "step": key, "attempt": step.attempt if step else None,
               "decision": decision, "comment": request.POST.get("comment", "").strip(),
               "values": posted_values(request.POST),
               "seen": request.POST.get("evidence_digest", ""), "nonce": _b64(nonce)}
    return hashlib.sha256(chain.digest(decided).encode()).digest()


def signing_options(request, run_id: int, key: str, decision: str) -> str:
    """The options (JSON) for navigator.credentials.get, their challenge bound to the
    posted form; the nonce stays in the session for the decision's post."""
    passkeys = list(request.user.passkeys.all())
    if not passkeys:
        raise InvalidInput("You have no passkey: add one on your profile, or sign with "
                           "your password.")
    nonce = secrets.token_bytes(16)
    request.session[f"{SIGNING}:{run_id}:{key}:{decision}"] = _b64(nonce)
    rp_id, _ = relying_party(request)
    options = webauthn.generate_authentication_options(
        rp_id=rp_id, challenge=_decided(request, run_id, key, decision, nonce),
        allow_credentials=[PublicKeyCredentialDescriptor(id=bytes(p.credential_id))
                           for p in passkeys],
        user_verification=UserVerificationRequirement.REQUIRED)
    return webauthn.options_to_json(options)


def verify_signature(request, run_id: int, key: str, decision: str, data: str) -> None:
    """Check a passkey's assertion over this very form, made by one of this person's
    passkeys with its user verified. NotPermitted otherwise; a failure counts as a failed
    sign-in (django-axes locks the account out after as many)."""
    username = request.user.get_username()
    if AxesProxyHandler.is_locked(request, credentials={"username": username}):
        raise NotPermitted("Too many failed signatures or sign-ins: your account is locked "
                           "for a while. Nothing was decided.")
    nonce = request.session.pop(f"{SIGNING}:{run_id}:{key}:{decision}", None)
    credential = _credential(data)
    passkey = Passkey.objects.filter(user=request.user,
                                     credential_id=_unb64(credential["rawId"])).first()
    try:
        if nonce is None or passkey is None:
            raise webauthn_errors.InvalidAuthenticationResponse(
                "not one of your passkeys" if passkey is None else "no signing was started")
        rp_id, origin = relying_party(request)
        verified = webauthn.verify_authentication_response(
            credential=credential,
            expected_challenge=_decided(request, run_id, key, decision, _unb64(nonce)),
            expected_rp_id=rp_id, expected_origin=origin,
            credential_public_key=bytes(passkey.public_key),
            credential_current_sign_count=passkey.sign_count, require_user_verification=True)
    except webauthn_errors.InvalidAuthenticationResponse as exc:
        user_login_failed.send(sender=__name__, credentials={"username": username},
                               request=request)
        raise NotPermitted(f"The passkey's signature does not verify ({exc}): nothing was "
                           "decided. Failed signatures count as failed sign-ins.") from None
    Passkey.objects.filter(pk=passkey.pk).update(sign_count=verified.new_sign_count,
                                                 last_used_at=clock.now())

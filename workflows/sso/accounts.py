"""People from the provider's claims: made on first sign-in, updated on every one, their
groups kept in step with the group claim (through TOLLGATE_OIDC_GROUP_MAP when set), and
their manager with TOLLGATE_OIDC_MANAGER_CLAIM when set."""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from workflows.models import Preference, SsoIdentity


class SignInRefused(Exception):
    """Claims Tollgate cannot sign anyone in with; the message says why."""


def password_allowed(username: str) -> bool:
    """May this username sign in with a password? Always, unless sign-on is the only way
    in; then only the break-glass accounts."""
    return not settings.TOLLGATE_OIDC_ONLY or username in settings.TOLLGATE_BREAK_GLASS


def groups_from(claims: dict) -> tuple[set[str], set[str] | None]:
    """(the groups the claim grants, the groups sign-on manages: None for all of them)."""
    value = claims.get(settings.TOLLGATE_OIDC_GROUPS_CLAIM) or []
    values = {value} if isinstance(value, str) else {v for v in value if isinstance(v, str)}
    mapping = settings.TOLLGATE_OIDC_GROUP_MAP
    if mapping:
        return {mapping[v] for v in values if v in mapping}, set(mapping.values())
    return {v[:150] for v in values if v.strip()}, None


def _username(claims: dict) -> str:
    """A free username from the claims (preferred_username, the e-mail's local part, sub)."""
    User = get_user_model()
    base = (claims.get("preferred_username") or (claims.get("email") or "").split("@")[0]
            or claims["sub"])
    base = re.sub(r"[^\w.@+-]", "_", str(base))[:140] or "user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}{n}"
    return name


def _set_manager(user, claimed) -> None:
    """The person's manager as the provider names them (by e-mail): the one active account
    with that e-mail, else none. The provider is the source of truth: no claim, no manager."""
    manager = None
    if isinstance(claimed, str) and claimed.strip():
        found = list(get_user_model().objects.filter(
            email__iexact=claimed.strip(), is_active=True).exclude(pk=user.pk)[:2])
        manager = found[0] if len(found) == 1 else None
    Preference.objects.update_or_create(user=user, defaults={"manager": manager})


def sign_in_user(claims: dict, issuer: str):
    """The user these claims name, made or updated, with their groups in step; in one
    transaction. Found by (issuer, sub); on first sign-in, linked to the one existing account
    with the same verified e-mail, else a new account."""
    User = get_user_model()
    subject = str(claims.get("sub") or "")
    if not subject:
        raise SignInRefused("The provider's answer names nobody (no sub claim).")
    email = str(claims.get("email") or "")
    verified = claims.get("email_verified") is True
    with transaction.atomic():
        identity = (SsoIdentity.objects.select_for_update().select_related("user")
                    .filter(issuer=issuer, subject=subject).first())
        if identity is not None:
            user = identity.user
        else:
            same = list(User.objects.filter(email__iexact=email)[:2]) if (email and verified) \
                else []
            user = same[0] if len(same) == 1 else User.objects.create_user(
                _username(claims), email=email)
            if len(same) != 1:
                user.set_unusable_password()
            identity = SsoIdentity(user=user, issuer=issuer, subject=subject)
        if not user.is_active:
            raise SignInRefused(f"The account {user.get_username()} is disabled in Tollgate.")
        user.email = email or user.email
        user.first_name = str(claims.get("given_name") or user.first_name)[:150]
        user.last_name = str(claims.get("family_name") or user.last_name)[:150]
        user.save()
        wanted, managed = groups_from(claims)
        current = set(user.groups.values_list("name", flat=True))
        dropped = (current - wanted) if managed is None else (current & managed) - wanted
        if dropped:
            user.groups.remove(*Group.objects.filter(name__in=dropped))
        for name in sorted(wanted - current):
            user.groups.add(Group.objects.get_or_create(name=name)[0])
        if settings.TOLLGATE_OIDC_MANAGER_CLAIM:
            _set_manager(user, claims.get(settings.TOLLGATE_OIDC_MANAGER_CLAIM))
        identity.email, identity.email_verified = email, verified
        identity.groups = sorted(wanted)
        identity.last_sign_in = timezone.now()
        identity.save()
    return user

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
    """The person's manager as the provider names them (by e-mail): the one active person
    whose sign-on identity has that e-mail verified by the provider, else none. Account
    e-mails are not asked: an admin or an unverified claim may have written those. The
    provider is the source of truth: no claim, no manager."""
    manager = None
    if isinstance(claimed, str) and claimed.strip():
        found = {identity.user_id: identity.user for identity in SsoIdentity.objects
                 .select_related("user").filter(email__iexact=claimed.strip(),
                                                 email_verified=True, user__is_active=True)
                 .exclude(user=user)[:2]}
        manager = next(iter(found.values())) if len(found) == 1 else None
    Preference.objects.update_or_create(user=user, defaults={"manager": manager})


def privileged(user) -> bool:
    """An account a first sign-on never links to by e-mail: staff, superusers and the
    break-glass accounts. An admin links those by hand (admin "SSO identities")."""
    return user.is_staff or user.is_superuser or (
        user.get_username() in settings.TOLLGATE_BREAK_GLASS)


def _linkable(email: str, verified: bool):
    """The one existing account a first sign-on joins: the only one with this e-mail, when
    the provider verified it and the account is not privileged; else None (a new account)."""
    if not (email and verified):
        return None
    same = list(get_user_model().objects.filter(email__iexact=email)[:2])
    if len(same) != 1:
        return None
    if privileged(same[0]):
        raise SignInRefused(
            f"Your company identity has the e-mail of {same[0].get_username()}, an "
            "administrator's account, which sign-on never joins by itself: ask an admin to "
            "link it (admin, SSO identities).")
    return same[0]


def sign_in_user(claims: dict, issuer: str):
    """The user these claims name, made or updated, with their groups in step; in one
    transaction. Found by (issuer, sub); on first sign-in, linked to the one existing
    account with the same verified e-mail (never a privileged one), else a new account.
    An e-mail the provider does not vouch for is never written, linked or matched."""
    User = get_user_model()
    subject = str(claims.get("sub") or "")
    if not subject:
        raise SignInRefused("The provider's answer names nobody (no sub claim).")
    email = str(claims.get("email") or "").strip()
    verified = claims.get("email_verified") is True
    with transaction.atomic():
        identity = (SsoIdentity.objects.select_for_update().select_related("user")
                    .filter(issuer=issuer, subject=subject).first())
        if identity is not None:
            user = identity.user
        else:
            user = _linkable(email, verified)
            if user is None:
                user = User.objects.create_user(_username(claims),
                                                email=email if verified else "")
                user.set_unusable_password()
            identity = SsoIdentity(user=user, issuer=issuer, subject=subject)
        if not user.is_active:
            raise SignInRefused(f"The account {user.get_username()} is disabled in Tollgate.")
        if verified and email:
            user.email = email
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
        identity.email, identity.email_verified = (email, True) if verified else ("", False)
        identity.groups = sorted(wanted)
        identity.object_id = str(claims.get("oid") or "")[:64]
        identity.tenant_id = str(claims.get("tid") or "")[:64]
        identity.last_sign_in = timezone.now()
        identity.save()
        if settings.TOLLGATE_OIDC_MANAGER_CLAIM:
            _set_manager(user, claims.get(settings.TOLLGATE_OIDC_MANAGER_CLAIM))
    return user

"""Which Tollgate user a chat account acts as: found by the verified e-mail sign-on vouched
for, or confirmed by the person, signed in, through a one-time link."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse

from workflows.models import ChatIdentity, SsoIdentity

SALT = "tollgate.chat-link"
LINK_SECONDS = 24 * 3600


def find(provider: str, team: str, chat_user: str) -> ChatIdentity | None:
    return (ChatIdentity.objects.select_related("user")
            .filter(provider=provider, team=team, chat_user=chat_user).first())


def match_by_email(provider: str, team: str, chat_user: str, name: str,
                   email: str) -> ChatIdentity | None:
    """Link the account to the one person whose sign-on identity has the same verified
    e-mail as the chat platform gives (None when there is not exactly one)."""
    if not email:
        return None
    return _link_the_one(SsoIdentity.objects.filter(email__iexact=email, email_verified=True),
                         provider, team, chat_user, name, "email")


def match_by_object_id(provider: str, team: str, chat_user: str, name: str,
                       object_id: str) -> ChatIdentity | None:
    """Link the account to the one person whose sign-on identity, in the same directory
    (Entra tenant), has this object id: the id the platform vouches for, as the provider
    did at sign-in (None when not exactly one)."""
    if not object_id or not team:
        return None
    return _link_the_one(SsoIdentity.objects.filter(object_id=object_id, tenant_id=team),
                         provider, team, chat_user, name, "object id")


def _link_the_one(identities, provider, team, chat_user, name, how) -> ChatIdentity | None:
    """Link the account to the one active person these sign-on identities name (None when
    they name nobody, or several)."""
    users = {i.user_id: i.user for i in identities.select_related("user").filter(
        user__is_active=True)}
    if len(users) != 1:
        return None
    return _link(provider, team, chat_user, name, next(iter(users.values())), how)


def object_ids(provider: str, team: str, user_ids) -> set[str]:
    """The directory (Entra) object ids of these users in this tenant: of their linked
    accounts on the platform, and as sign-on gave them."""
    linked = ChatIdentity.objects.filter(provider=provider, team=team, user_id__in=user_ids)
    signed = SsoIdentity.objects.filter(user_id__in=user_ids, tenant_id=team).exclude(
        object_id="")
    return (set(linked.values_list("chat_user", flat=True))
            | set(signed.values_list("object_id", flat=True)))


def verified_emails(user) -> set[str]:
    """The e-mails someone vouched for as this person's, lower-cased: those the sign-on
    provider verified, and the account's own e-mail where no provider speaks for the person
    (an admin wrote it; sign-on writes only verified e-mails)."""
    identities = list(SsoIdentity.objects.filter(user=user)
                      .values_list("email", "email_verified"))
    found = {email.lower() for email, verified in identities if verified and email}
    if user.email and not identities:
        found.add(user.email.lower())
    return found


def _link(provider, team, chat_user, name, user, how) -> ChatIdentity | None:
    try:
        with transaction.atomic():
            return ChatIdentity.objects.create(provider=provider, team=team,
                                               chat_user=chat_user, user=user,
                                               name=name[:200], matched_by=how)
    except IntegrityError:
        return find(provider, team, chat_user)


@dataclass(frozen=True)
class LinkRequest:
    provider: str
    team: str
    chat_user: str
    name: str
    email: str  # as the chat platform reported it when the link was made


class BadLink(ValueError):
    pass


def link_url(provider: str, team: str, chat_user: str, name: str, email: str) -> str:
    """A signed link (a day long) the person opens while signed in to Tollgate to confirm
    that this chat account is theirs."""
    token = signing.dumps({"p": provider, "t": team, "u": chat_user, "n": name, "e": email},
                          salt=SALT, compress=True)
    return f"{settings.TOLLGATE_BASE_URL}{reverse('chat_link', args=[token])}"


def read_link(token: str) -> LinkRequest:
    try:
        data = signing.loads(token, salt=SALT, max_age=LINK_SECONDS)
        return LinkRequest(data["p"], data["t"], data["u"], data.get("n", ""),
                           data.get("e", ""))
    except signing.SignatureExpired:
        raise BadLink("This link expired: press the button in chat again for a new one.") \
            from None
    except (signing.BadSignature, KeyError, TypeError):
        raise BadLink("This is not a Tollgate chat link (it may have been cut short).") \
            from None


def refusal(request: LinkRequest, user) -> str:
    """Why this person may not confirm the link ("" when they may): the chat platform must
    report, for that account, an e-mail vouched for as theirs. A link forwarded to someone
    else (a phished "please click this") links nothing."""
    if not request.email:
        return (f"{request.provider.capitalize()} reports no e-mail for this account, so "
                "Tollgate cannot tell whose it is: ask an admin to link it (admin, Chat "
                "identities).")
    if request.email.lower() not in verified_emails(user):
        return (f"{request.provider.capitalize()} reports this account's e-mail as "
                f"{request.email}, which is not yours in Tollgate: only its owner can link "
                "it. If it is yours, ask an admin to link it (admin, Chat identities).")
    return ""


def confirm(request: LinkRequest, user) -> ChatIdentity:
    """Link the chat account to this user, if the platform's e-mail for it is theirs. Once
    linked, the link is spent: it cannot move the account to someone else."""
    if problem := refusal(request, user):
        raise BadLink(problem)
    identity = _link(request.provider, request.team, request.chat_user, request.name, user,
                     "link")
    if identity is None or identity.user_id != user.pk:
        raise BadLink("That chat account already acts as another Tollgate user; an admin "
                      "can remove that link (Chat identities) if it is wrong.")
    return identity

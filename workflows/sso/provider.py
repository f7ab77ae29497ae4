"""The OpenID Connect client, configured from settings (discovery from the issuer)."""

from __future__ import annotations

from functools import cache

from authlib.integrations.django_client import OAuth
from django.conf import settings


def enabled() -> bool:
    return bool(settings.TOLLGATE_OIDC_ISSUER)


@cache
def _client(issuer: str, client_id: str, secret: str, scopes: str):
    oauth = OAuth()
    return oauth.register(
        "company", client_id=client_id, client_secret=secret or None,
        server_metadata_url=f"{issuer}/.well-known/openid-configuration",
        client_kwargs={"scope": scopes, "code_challenge_method": "S256",
                       **({} if secret else {"token_endpoint_auth_method": "none"})})


def client():
    """The provider's client (Authlib), one per configuration: its discovery document and
    keys are fetched once and kept."""
    return _client(settings.TOLLGATE_OIDC_ISSUER, settings.TOLLGATE_OIDC_CLIENT_ID,
                   settings.TOLLGATE_OIDC_CLIENT_SECRET, settings.TOLLGATE_OIDC_SCOPES)

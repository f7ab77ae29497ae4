"""System checks: what a production deployment must set for Tollgate to work."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security, deploy=True)
def base_url(app_configs, **kwargs):
    """Mail and webhooks carry absolute links: production must say where Tollgate lives."""
    url = settings.TOLLGATE_BASE_URL
    parts = urlsplit(url)
    if not url or parts.scheme not in ("http", "https") or not parts.netloc:
        return [Error(
            "TOLLGATE_BASE_URL is not an absolute http(s) URL: links in mail and webhooks "
            "would not open.", hint="Set TOLLGATE_BASE_URL, e.g. https://tollgate.example.com",
            id="tollgate.E001")]
    if parts.scheme != "https":
        return [Warning("TOLLGATE_BASE_URL is not https: decision links would travel in clear.",
                        hint="Serve Tollgate over HTTPS and set an https:// base URL.",
                        id="tollgate.W001")]
    return []


@register()
def command_user(app_configs, **kwargs):
    """Commands run as TOLLGATE_COMMAND_USER must find that account on this machine."""
    name = settings.TOLLGATE_COMMAND_USER
    if not name:
        return []
    import os
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return [Error(f"TOLLGATE_COMMAND_USER {name!r} is not an account on this machine.",
                      id="tollgate.E002")]
    if os.geteuid() != 0 and settings.TOLLGATE_ROLE != "web":
        return [Warning("TOLLGATE_COMMAND_USER is set but this process is not root: a worker "
                        "needs root (or CAP_SETUID and CAP_SETGID) to run commands as another "
                        "account.", id="tollgate.W002")]
    return []


@register(Tags.security, deploy=True)
def sign_on_issuer(app_configs, **kwargs):
    """The provider's discovery document, keys and tokens travel from the issuer: over plain
    HTTP anyone on the path could sign people in as anyone."""
    issuer = settings.TOLLGATE_OIDC_ISSUER
    if issuer and urlsplit(issuer).scheme != "https":
        return [Error(f"TOLLGATE_OIDC_ISSUER {issuer!r} is not https: the provider's keys and "
                      "tokens would travel in clear, and anyone on the way could sign in as "
                      "anyone.", hint="Use the provider's https:// issuer URL.",
                      id="tollgate.E003")]
    return []


@register(deploy=True)
def push_keys(app_configs, **kwargs):
    """Without a VAPID key people's browsers and phones are never notified."""
    if not settings.TOLLGATE_VAPID_KEY_FILE:
        return [Warning("TOLLGATE_VAPID_KEY_FILE is not set: push notifications are off, so "
                        "a gate waiting on someone reaches their phone only by mail or chat.",
                        hint="Point it at a file every web and consumer process reads (made "
                             "at first use when missing), and set TOLLGATE_VAPID_SUBJECT to "
                             "a mailto: or https: contact for the push services.",
                        id="tollgate.W012")]
    return []


@register(Tags.security, deploy=True)
def api_docs(app_configs, **kwargs):
    """The API's description tells an anonymous caller every route and field."""
    if settings.TOLLGATE_API_DOCS_PUBLIC:
        return [Warning("TOLLGATE_API_DOCS_PUBLIC is on: anyone can read the API's "
                        "description and docs without signing in.",
                        hint="Leave it off in production; signed-in people still read them.",
                        id="tollgate.W003")]
    return []


@register(Tags.security, deploy=True)
def audit_key(app_configs, **kwargs):
    """The key that seals the audit chains must be kept from those it guards against. A web
    role (TOLLGATE_ROLE=web) neither seals nor runs commands: it needs neither."""
    import os

    if settings.TOLLGATE_ROLE == "web":
        return []
    if not os.environ.get("TOLLGATE_AUDIT_KEY_FILE"):
        return [Warning("TOLLGATE_AUDIT_KEY_FILE is not set: the key that seals the audit "
                        "chains is made in the var/ folder, beside the SQLite database, where "
                        "whoever can change the records may read it.",
                        hint="Make an Ed25519 key (openssl genpkey -algorithm ed25519) on a "
                             "path database users cannot read, and name it here.",
                        id="tollgate.W004")]
    path = settings.TOLLGATE_AUDIT_KEY_FILE
    found = []
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            found.append(Warning(
                f"The audit's signing key {path} can be read by others than its owner "
                f"(mode {mode:o}).", hint=f"chmod 600 {path}", id="tollgate.W010"))
    elif os.path.exists(os.path.dirname(path) or ".") and not os.access(
            os.path.dirname(path) or ".", os.W_OK):
        found.append(Error(f"TOLLGATE_AUDIT_KEY_FILE {path!r} does not exist and its folder "
                           "cannot be written: the sealer cannot make it.",
                           id="tollgate.E004"))
    if not settings.TOLLGATE_COMMAND_USER:
        found.append(Warning(
            f"TOLLGATE_COMMAND_USER is not set: command steps run as the consumer's own user, "
            f"and any spec author's command can read what it can, the audit's signing key "
            f"{path} included, and sign a rewritten record.",
            hint="Run commands as a user of their own (TOLLGATE_COMMAND_USER); keep the key "
                 "readable by the consumer's user alone. Without it run_huey refuses to start "
                 "unless DEBUG or TOLLGATE_COMMANDS_AS_CONSUMER is set.", id="tollgate.W011"))
    return found


def key_exposed_to_commands() -> str:
    """Why a consumer must not start ("" if it may): without TOLLGATE_COMMAND_USER its command
    steps run as its own account, which reads the audit's signing key (the consumers seal).
    DEBUG (`make run`) or TOLLGATE_COMMANDS_AS_CONSUMER takes that risk knowingly."""
    if settings.TOLLGATE_COMMAND_USER or settings.DEBUG or \
            settings.TOLLGATE_COMMANDS_AS_CONSUMER:
        return ""
    return (f"run_huey does not start: TOLLGATE_COMMAND_USER is not set, so command steps "
            f"would run as this consumer's own account, which reads the audit's signing key "
            f"({settings.TOLLGATE_AUDIT_KEY_FILE}), and any spec author's command could sign "
            f"a rewritten record. Set TOLLGATE_COMMAND_USER to an account of its own (the "
            f"consumer runs as root or with CAP_SETUID), or TOLLGATE_COMMANDS_AS_CONSUMER=1 "
            f"to take that risk.")


@register(Tags.security)
def audit_timestamps(app_configs, **kwargs):
    """A timestamp authority's answers are worth only as much as the roots they chain to."""
    if not settings.TOLLGATE_AUDIT_TSA_URL:
        return []
    path = settings.TOLLGATE_AUDIT_TSA_CA_FILE
    try:
        from cryptography import x509

        with open(path, "rb") as handle:
            if not x509.load_pem_x509_certificates(handle.read()):
                raise ValueError("it holds no certificate")
    except (OSError, ValueError) as exc:
        return [Error(f"TOLLGATE_AUDIT_TSA_URL is set, and TOLLGATE_AUDIT_TSA_CA_FILE "
                      f"{path!r} holds no root certificate to check its answers with: {exc}",
                      hint="Name the PEM file of the timestamp authority's root "
                           "certificate(s).", id="tollgate.E005")]
    return []


@register(Tags.security)
def teams_tenant(app_configs, **kwargs):
    """Teams on without its tenant would have to trust any company's directory: a person
    there could name themselves with one of ours' e-mails."""
    if (settings.TOLLGATE_TEAMS_APP_ID and settings.TOLLGATE_TEAMS_APP_PASSWORD
            and not settings.TOLLGATE_TEAMS_TENANT_ID):
        return [Error("Teams is set up (TOLLGATE_TEAMS_APP_ID and _APP_PASSWORD) without "
                      "TOLLGATE_TEAMS_TENANT_ID: every Teams request is refused until the "
                      "tenant is named.",
                      hint="Set it to the Directory (tenant) ID of the app registration.",
                      id="tollgate.E006")]
    return []


@register(Tags.security)
def process_role(app_configs, **kwargs):
    """The deploy checks read TOLLGATE_ROLE to know what this process's container runs."""
    if settings.TOLLGATE_ROLE not in ("all", "web", "consumer"):
        return [Error(f"TOLLGATE_ROLE {settings.TOLLGATE_ROLE!r} is not a role: use web "
                      "(the web app and events server), consumer, or all.",
                      id="tollgate.E010")]
    return []

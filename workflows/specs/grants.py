"""Which specs may name which secrets: TOLLGATE_SECRET_GRANTS, spec name (or a pattern such
as "release-*" for a group of specs) to the secret names (or patterns) it may use. A secret
granted to no spec is used by none; the worker checks again before it resolves one."""

from __future__ import annotations

from fnmatch import fnmatchcase

from django.conf import settings


def granted(spec: str, secret: str) -> bool:
    """May the spec named `spec` read the secret named `secret`?"""
    return any(fnmatchcase(spec, specs) and any(fnmatchcase(secret, s) for s in secrets)
               for specs, secrets in settings.TOLLGATE_SECRET_GRANTS.items())


def refusal(spec: str, secret: str) -> str:
    return (f"secret {secret!r} is not granted to spec {spec!r} (grant it in "
            "TOLLGATE_SECRET_GRANTS)")


def secrets_named(step: dict) -> list[tuple[str, str]]:
    """(where, secret name) for each {"secret": NAME} in a normalised step's run and
    compensation env."""
    found = []
    for block in ("run", "compensation"):
        env = (step.get(block) or {}).get("env") or {}
        for name, value in env.items():
            if isinstance(value, dict):
                found.append((f"step {step['key']!r} {block} env {name}", value["secret"]))
    return found


def grants_reaching(spec: str) -> list[str]:
    """The TOLLGATE_SECRET_GRANTS patterns a spec of this name would be granted by."""
    return [specs for specs, secrets in settings.TOLLGATE_SECRET_GRANTS.items()
            if secrets and fnmatchcase(spec, specs)]

"""The chat platforms set up here, by name: each is on when its settings are (Slack: a bot
token and signing secret; Teams: an app id, its secret and tenant)."""

from __future__ import annotations

from . import slack, teams

MODULES = {"slack": slack, "teams": teams}


def enabled() -> list:
    """A provider for each platform that is set up."""
    return [module.provider() for module in MODULES.values() if module.enabled()]


def any_enabled() -> bool:
    return any(module.enabled() for module in MODULES.values())


def get(name: str):
    """The named platform's provider, or None when it is not set up (or unknown)."""
    module = MODULES.get(name)
    return module.provider() if module is not None and module.enabled() else None

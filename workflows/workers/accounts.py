"""Accounts a step runs under: the environment for a profile, resolved on the worker.

A step (or its agent) may name `"account": {"profile": "work", "tool": "..."}`. The worker
asks TOLLGATE_ACCOUNTS (a JSON object, profile: {KEY: VALUE}) first, else runs
TOLLGATE_ACCOUNT_COMMAND (argv with "{tool}" and "{profile}") and reads the `export
KEY=VALUE` lines it prints. The tool defaults from the agent's provider
(TOLLGATE_ACCOUNT_TOOLS, provider: tool; else the provider's name). The variables go into
that step's environment only; every value is redacted from what is stored, and only the
profile and tool are recorded.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from django.conf import settings

EXPORT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class AccountError(Exception):
    """An account this worker cannot resolve; the message says which and why."""


def tool_for(account: dict, provider: str | None) -> str:
    if account.get("tool"):
        return account["tool"]
    if provider:
        return settings.TOLLGATE_ACCOUNT_TOOLS.get(provider, provider)
    return ""


def described(account: dict, provider: str | None) -> dict:
    """What is recorded of an account: its profile and tool, never its values."""
    return {"profile": account["profile"], "tool": tool_for(account, provider)}


def parse_exports(text: str) -> dict[str, str]:
    """`export KEY=VALUE` (or `KEY=VALUE`) lines, values unquoted as a shell would."""
    found = {}
    for line in text.splitlines():
        match = EXPORT.match(line)
        if not match:
            continue
        try:
            words = shlex.split(match[2])
        except ValueError:
            continue
        found[match[1]] = words[0] if words else ""
    return found


def environment(account: dict | None, provider: str | None = None) -> dict[str, str]:
    """The variables an account adds to a step's environment ({} without an account)."""
    if not account:
        return {}
    profile = account["profile"]
    if profile in settings.TOLLGATE_ACCOUNTS:
        return {str(k): str(v) for k, v in settings.TOLLGATE_ACCOUNTS[profile].items()}
    template = settings.TOLLGATE_ACCOUNT_COMMAND
    tool = tool_for(account, provider)
    if not template:
        raise AccountError(f"Account {profile!r}: not in TOLLGATE_ACCOUNTS and no "
                           "TOLLGATE_ACCOUNT_COMMAND to resolve it")
    if not tool:
        raise AccountError(f"Account {profile!r}: name its tool (account.tool)")
    argv = [part.replace("{tool}", tool).replace("{profile}", profile) for part in template]
    clean = {name: os.environ[name] for name in settings.TOLLGATE_COMMAND_ENV
             if name in os.environ}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=clean,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AccountError(f"Account {profile!r}: {argv[0]} could not run "
                           f"({type(exc).__name__})") from None
    if done.returncode != 0:
        raise AccountError(f"Account {profile!r}: {argv[0]} exited with status "
                           f"{done.returncode}")
    found = parse_exports(done.stdout)
    if not found:
        raise AccountError(f"Account {profile!r}: {argv[0]} printed no export KEY=VALUE line")
    return found

"""Coding agents as steps: each provider's non-interactive command line.

The defaults are the command lines the agents document for one-shot use. `codewith` and
`aicopilot` have none confirmed here, so they run only when an operator sets theirs in
TOLLGATE_AGENT_COMMANDS (a JSON object, provider: argv with "{prompt}"), which also
overrides any default.
"""

from __future__ import annotations

from django.conf import settings

# "--" ends the options: a prompt filled from params can never pass one (each of these
# parses its arguments with a library that honours it).
DEFAULT_COMMANDS = {
    "claude": ["claude", "-p", "--", "{prompt}"],
    "codex": ["codex", "exec", "--", "{prompt}"],
    "opencode": ["opencode", "run", "--", "{prompt}"],
    "cursor": ["cursor-agent", "-p", "--", "{prompt}"],
}


class ProviderError(Exception):
    """A provider this worker cannot run; the message says how to set it up."""


def command_line(provider: str, prompt: str) -> list[str]:
    """The argv that runs `provider` on `prompt` (the prompt is one argument, no shell)."""
    template = {**DEFAULT_COMMANDS, **settings.TOLLGATE_AGENT_COMMANDS}.get(provider)
    if not template:
        raise ProviderError(f"Agent provider {provider!r} has no command line on this "
                            "worker: set it in TOLLGATE_AGENT_COMMANDS, e.g. "
                            f'{{"{provider}": ["{provider}", "--prompt", "{{prompt}}"]}}')
    argv = [prompt if part == "{prompt}" else part for part in template]
    if prompt.startswith("-") and "{prompt}" in template and (
            "--" not in template[:template.index("{prompt}")]):
        raise ProviderError(f"Agent provider {provider!r}: the prompt begins with '-' and "
                            "its command line has no '--' before \"{prompt}\", so it would "
                            "be read as an option; refused")
    return argv

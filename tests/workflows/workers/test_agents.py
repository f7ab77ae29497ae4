"""Agent steps: a coding agent run as a command, with its account, by a real consumer."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.conftest import make_user
from tests.workflows.consumers import wait_for
from workflows import engine
from workflows.models import Checkpoint, Run, Step
from workflows.specs.storage import require_author, store_spec
from workflows.specs.validation import SpecError, validate_spec
from workflows.workers.executors import execute


def fake(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path):
    """Fake agents and an account tool on a PATH of the test's own."""
    folder = tmp_path / "bin"
    folder.mkdir()
    fake(folder, "claude", 'echo "claude was given: $*"; echo "token=$ACCT_TOKEN"; '
                           'echo \'{"reviewed": true}\' > "$TOLLGATE_STATE_PATCH_FILE"')
    fake(folder, "codex", 'echo "codex is down" >&2; exit 3')
    fake(folder, "acct", 'test "$1" = env || exit 2; '
                         'echo "export ACCT_TOKEN=\'sekret-$2-123\'"; echo "# a comment"')
    return folder


SPEC = {"name": "review", "params": [{"name": "version", "type": "string"}], "steps": [
    {"key": "review", "title": "Agent review", "run": {"agent": {
        "providers": ["codex", "claude"], "prompt": "Review release {{ params.version }}",
        "account": {"profile": "work", "tool": "acct"}}}},
]}


@pytest.mark.consumer
@pytest.mark.django_db(transaction=True)
def test_a_consumer_runs_an_agent_with_its_account_and_falls_back(consumers, bin_dir):
    consumers(workers=1, PATH=f"{bin_dir}:{os.environ['PATH']}",
              TOLLGATE_ACCOUNT_COMMAND=json.dumps(["{tool}", "env", "{profile}"]))
    run = engine.open_run(store_spec(SPEC)[0], params={"version": "2.0"}).run
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", 30,
             what="the agent step to complete")
    step = Step.objects.get(run=run)
    evidence = step.last_evidence
    assert evidence["stdout"].splitlines() == [
        "claude was given: -p -- Review release 2.0", "token=[redacted]"]
    assert evidence["provider"] == "claude" and evidence["providers_tried"] == ["codex", "claude"]
    assert evidence["account"] == {"profile": "work", "tool": "acct"}
    assert Run.objects.get(pk=run.pk).shared_state == {"reviewed": True}
    done = Checkpoint.objects.get(run=run, kind="step_completed")
    assert "agent claude" in done.summary and "sekret" not in json.dumps(done.evidence)


def test_an_unconfigured_provider_says_how_to_set_it(settings):
    settings.TOLLGATE_AGENT_COMMANDS = {}
    outcome = execute({"agent": {"providers": ["codewith"], "prompt": "hi"}},
                      context={"run_id": 1, "step_key": "a", "attempt": 1}, shared_state={},
                      stop=threading.Event())
    assert not outcome.ok and "set it in TOLLGATE_AGENT_COMMANDS" in outcome.summary
    assert outcome.evidence["provider"] == "codewith"


@pytest.mark.parametrize("provider", ["claude", "codex", "opencode", "cursor"])
def test_a_prompt_filled_to_look_like_an_option_stays_the_prompt(tmp_path, settings,
                                                                  monkeypatch, provider):
    """A requester's param at the start of the prompt cannot pass an option to the agent:
    every default command line ends its options with "--" before the prompt."""
    from workflows.workers import agents

    settings.TOLLGATE_AGENT_COMMANDS = {}
    program = agents.DEFAULT_COMMANDS[provider][0]
    fake(tmp_path, program, 'for a in "$@"; do echo "arg:$a"; done')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    outcome = execute({"agent": {"providers": [provider], "prompt": "{{ params.task }}"}},
                      context={"run_id": 1, "step_key": "a", "attempt": 1,
                               "params": {"task": "--dangerously-skip-permissions"}},
                      shared_state={}, stop=threading.Event())
    assert outcome.ok, outcome.summary
    args = outcome.evidence["stdout"].splitlines()
    assert args[-2:] == ["arg:--", "arg:--dangerously-skip-permissions"]


def test_a_command_line_without_an_end_of_options_refuses_such_a_prompt(settings):
    settings.TOLLGATE_AGENT_COMMANDS = {"mine": ["mine", "--prompt", "{prompt}"]}
    outcome = execute({"agent": {"providers": ["mine"], "prompt": "{{ params.task }}"}},
                      context={"run_id": 1, "step_key": "a", "attempt": 1,
                               "params": {"task": "-rf /"}},
                      shared_state={}, stop=threading.Event())
    assert not outcome.ok and "begins with '-'" in outcome.summary
    assert "no '--' before" in outcome.summary


def test_an_account_from_settings_goes_to_that_step_only(settings):
    settings.TOLLGATE_ACCOUNTS = {"ci": {"DEPLOY_KEY": "k-0123456"}}
    context = {"run_id": 1, "step_key": "a", "attempt": 1}
    outcome = execute({"shell": 'echo "$DEPLOY_KEY"', "account": {"profile": "ci"}},
                      context=context, shared_state={}, stop=threading.Event())
    assert outcome.ok and outcome.evidence["stdout"] == "[redacted]\n"
    assert outcome.evidence["account"] == {"profile": "ci", "tool": ""}
    other = execute({"shell": 'echo "[$DEPLOY_KEY]"'}, context=context, shared_state={},
                    stop=threading.Event())
    assert other.evidence["stdout"] == "[]\n"


@pytest.mark.parametrize("agent, problem", [
    ({"provider": "gpt", "prompt": "x"}, "provider 'gpt' is not one of"),
    ({"provider": "claude", "providers": ["codex"], "prompt": "x"}, "not both"),
    ({"provider": "claude"}, "needs a prompt"),
    ({"provider": "claude", "prompt": "x", "account": {"tool": "t"}}, "needs a profile"),
    ({"provider": "claude", "prompt": "x", "model": "big"}, "unknown field 'model'"),
])
def test_bad_agents_are_refused_naming_the_step(agent, problem):
    with pytest.raises(SpecError, match=f"step 'a' run agent.*{problem}"):
        validate_spec({"name": "s", "steps": [{"key": "a", "run": {"agent": agent}}]})


@pytest.mark.django_db
def test_a_spec_with_an_agent_needs_the_right_to_run_programs():
    loader = make_user("loader", perms=("add_workflowspec",))
    definition = validate_spec(SPEC)
    with pytest.raises(engine.NotPermitted, match="author_command_spec"):
        require_author(loader, definition)

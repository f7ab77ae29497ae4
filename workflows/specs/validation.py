"""Workflow spec validation: the format, checked as a whole, imports no model.

A spec is refused as a whole; every error names the step and the problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from django.conf import settings

from workflows.specs import grants
from workflows.specs.params import check_fields

TOP_FIELDS = {"name", "version", "description", "steps", "params", "max_parallel"}
STEP_FIELDS = {
    "key", "title", "description", "depends_on", "run", "approval", "max_retries",
    "retry_backoff_seconds", "retry_backoff", "retry_backoff_max_seconds",
    "continue_on_failure", "compensation", "timeout_seconds", "on_timeout", "when",
}
WAIT_OUTCOMES = ("fail", "skip")
ACTION_FIELDS = {"command", "shell", "callable", "agent", "timeout_seconds", "cwd", "env",
                 "account", "workflow", "params", "on_parent_failure"}
# A run inside a run: `{"workflow": SPEC_NAME, "params": {...}}`, and what becomes of the
# child when another step fails the parent (`on_parent_failure`: cancel, the default, or
# continue).
WORKFLOW_FIELDS = {"workflow", "params", "on_parent_failure"}
SPEC_NAME = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")
# Coding agents a step may run, each through its non-interactive command line (settings).
PROVIDERS = ("claude", "cursor", "codewith", "aicopilot", "opencode", "codex")
AGENT_FIELDS = {"provider", "prompt", "account", "providers"}
ACCOUNT_FIELDS = {"profile", "tool"}
PROMPT_LIMIT = 20000
APPROVAL_FIELDS = {
    "group", "required", "allow_self_approval", "timeout_seconds", "on_timeout", "escalate_to",
    "form", "remind_after_seconds", "remind_every_seconds", "rules", "reject", "signature",
}
# One approval rule: who (a group, or the requester's manager), how many, when, in which stage.
RULE_FIELDS = {"when", "group", "manager", "required", "allow_self_approval", "order", "label",
               "signature"}
REJECT_POLICIES = ("any", "quorum")
RULES_LIMIT = 20
# A step's `when`: where to look (shared state or params, a dotted path) and one test.
WHEN_SOURCES = ("state", "params")
WHEN_TESTS = ("equals", "not_equals", "in", "exists", "gt", "gte", "lt", "lte")
NUMERIC_TESTS = ("gt", "gte", "lt", "lte")
WHEN_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,9}$")
BACKOFF_KINDS = {"fixed", "exponential"}
SECRET_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class SpecError(ValueError):
    """A spec that cannot be stored; the message says where and why."""


def _fail(where: str, problem: str):
    raise SpecError(f"{where}: {problem}")


def _unknown(where: str, data: dict, allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        _fail(where, f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


# Sane maxima, all finite: a spec can ask for a lot, never for what overflows a date or a column.
LIMITS = {
    "max_retries": 100,
    "retry_backoff_seconds": 86400,
    "retry_backoff_max_seconds": 7 * 86400,
    "timeout_seconds": 30 * 86400,
    "remind_after_seconds": 30 * 86400,
    "remind_every_seconds": 30 * 86400,
    "required": 100,
    "order": 100,
    "max_parallel": 10000,
}
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
# The lengths the database stores.
TEXT_LIMITS = {"title": 200, "group": 150, "escalate_to": 150, "description": 10000,
               "label": 200}


def _number(where: str, data: dict, field: str, *, integer: bool = False, positive=False):
    if field not in data:
        return
    value = data[field]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        _fail(where, f"{field} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        _fail(where, f"{field} must be a finite number, got {value}")
    if value < 0:
        _fail(where, f"{field} must not be negative, got {value}")
    if positive and value == 0:
        _fail(where, f"{field} must be greater than 0")
    if value > LIMITS[field]:
        _fail(where, f"{field} must be at most {LIMITS[field]}, got {value}")


def _text(where: str, data: dict, field: str) -> None:
    if field in data and isinstance(data[field], str) and len(data[field]) > TEXT_LIMITS[field]:
        _fail(where, f"{field} is longer than {TEXT_LIMITS[field]} characters")


def allowed_callable(path: str):
    """The function a dotted path names, if it is on the TOLLGATE_CALLABLES allow-list and is
    a function defined in that module (not a module, class or name it merely imported);
    else None."""
    listed = any(
        entry == path or (entry.endswith(".*") and path.startswith(entry[:-1])
                          and "." not in path[len(entry) - 1:])
        for entry in settings.TOLLGATE_CALLABLES)
    if not listed:
        return None
    import inspect

    from django.utils.module_loading import import_string

    try:
        func = import_string(path)
    except ImportError:
        return None
    return func if inspect.isfunction(func) and func.__module__ == path.rpartition(".")[0] \
        else None


def callable_allowed(path: str) -> bool:
    """True if the dotted path may be a spec's `callable` (see allowed_callable)."""
    return allowed_callable(path) is not None


def _validate_account(where: str, account) -> dict:
    """An account whose environment the worker resolves for this step: a profile, and the
    tool that prints it (defaulting from the agent's provider)."""
    if not isinstance(account, dict):
        _fail(where, 'must be an object such as {"profile": "work"}')
    _unknown(where, account, ACCOUNT_FIELDS)
    for name in ("profile", "tool"):
        value = account.get(name)
        if name in account and (not isinstance(value, str) or not SECRET_NAME.match(value)):
            _fail(f"{where} {name}", "must be 1 to 100 letters, digits, '-', '_' or '.'")
    if "profile" not in account:
        _fail(where, "needs a profile")
    return account


def _validate_agent(where: str, agent) -> dict:
    if not isinstance(agent, dict):
        _fail(where, 'must be an object such as {"provider": "claude", "prompt": "..."}')
    _unknown(where, agent, AGENT_FIELDS)
    providers = agent.get("providers", [agent.get("provider")] if "provider" in agent else [])
    if "provider" in agent and "providers" in agent:
        _fail(where, "needs provider or providers (a list tried in order), not both")
    if not isinstance(providers, list) or not providers:
        _fail(where, f"needs a provider (one of {', '.join(PROVIDERS)})")
    for provider in providers:
        if provider not in PROVIDERS:
            _fail(where, f"provider {provider!r} is not one of {', '.join(PROVIDERS)}")
    prompt = agent.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        _fail(where, "needs a prompt (a non-empty string)")
    if len(prompt) > PROMPT_LIMIT:
        _fail(where, f"prompt is longer than {PROMPT_LIMIT} characters")
    normal = {"providers": providers, "prompt": prompt}
    if "account" in agent:
        normal["account"] = _validate_account(f"{where} account", agent["account"])
    return normal


def _validate_workflow(where: str, action: dict) -> dict:
    extra = sorted(set(action) - WORKFLOW_FIELDS)
    if extra:
        _fail(where, "a workflow step takes only workflow, params and on_parent_failure "
                     f"(got {', '.join(extra)})")
    name = action["workflow"]
    if not isinstance(name, str) or not SPEC_NAME.match(name):
        _fail(where, "workflow must be a spec name (letters, digits, - or _)")
    params = action.get("params", {})
    if not isinstance(params, dict):
        _fail(where, "params must be an object of the child spec's parameters")
    on_failure = action.get("on_parent_failure", "cancel")
    if on_failure not in ("cancel", "continue"):
        _fail(where, "on_parent_failure must be 'cancel' (the child is cancelled when another "
                     f"step fails the parent) or 'continue', got {on_failure!r}")
    normal = {"workflow": name, "params": params}
    if on_failure == "continue":
        normal["on_parent_failure"] = "continue"
    return normal


def _validate_action(where: str, action, *, compensation: bool = False) -> dict:
    if not isinstance(action, dict):
        _fail(where, "must be an object with one of command, shell, callable, agent or "
                     "workflow")
    _unknown(where, action, ACTION_FIELDS)
    given = [k for k in ("command", "shell", "callable", "agent", "workflow") if k in action]
    if len(given) != 1:
        _fail(where, "needs exactly one of command, shell, callable, agent or workflow"
              + (f" (got {', '.join(given)})" if given else ""))
    if "workflow" in action:
        if compensation:
            _fail(where, "a compensation is a command, shell, callable or agent, not a "
                         "workflow")
        return _validate_workflow(where, action)
    if "params" in action or "on_parent_failure" in action:
        _fail(where, "params and on_parent_failure belong to a workflow step")
    if "agent" in action:
        action = {**action, "agent": _validate_agent(f"{where} agent", action["agent"])}
    if "account" in action:
        if "callable" in action:
            _fail(where, "account is for a command, shell or agent step")
        if "agent" in action and "account" in action["agent"]:
            _fail(where, "give the account once, in run or in agent")
        action = {**action, "account": _validate_account(f"{where} account",
                                                         action["account"])}
    if "command" in action:
        command = action["command"]
        if isinstance(command, str):
            _fail(where, "command must be a list of arguments, not a string "
                  "(use shell for a shell line)")
        if isinstance(command, list) and command and isinstance(command[0], str) and (
                " " in command[0].strip()):
            _fail(where, f"command[0] {command[0]!r} has spaces: it would be run as one "
                         "program name; use shell or split the arguments")
        if not isinstance(command, list) or not command or not all(
            isinstance(arg, str) for arg in command
        ):
            _fail(where, "command must be a non-empty list of strings")
    if "shell" in action and (not isinstance(action["shell"], str) or not action["shell"].strip()):
        _fail(where, "shell must be a non-empty string")
    if "callable" in action:
        path = action["callable"]
        if not isinstance(path, str) or not path:
            _fail(where, "callable must be a dotted path")
        if not callable_allowed(path):
            _fail(where, f"callable {path!r} is not on the allow-list (TOLLGATE_CALLABLES)")
    _number(where, action, "timeout_seconds", positive=True)
    if "cwd" in action and not isinstance(action["cwd"], str):
        _fail(where, "cwd must be a string")
    if "env" in action:
        env = action["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
            _fail(where, 'env must map names to strings or {"secret": NAME}')
        for name, value in env.items():
            if isinstance(value, dict):
                if set(value) != {"secret"} or not isinstance(value["secret"], str) or (
                        not SECRET_NAME.match(value["secret"])):
                    _fail(f"{where} env {name}", 'a secret is {"secret": NAME}, NAME being 1 to '
                          "100 letters, digits, '-', '_' or '.'")
            elif not isinstance(value, str):
                _fail(f"{where} env {name}", 'must be a string or {"secret": NAME}')
    return action


MASKED = "[masked]"


def masked(definition: dict) -> dict:
    """The spec (or step) with every inline env value masked; secrets stay named. What a
    person without change_workflowspec is shown."""
    def action(block):
        if not isinstance(block, dict) or not isinstance(block.get("env"), dict):
            return block
        return {**block, "env": {name: value if isinstance(value, dict) else MASKED
                                 for name, value in block["env"].items()}}

    def step(item):
        if not isinstance(item, dict):
            return item
        return {**item, **{k: action(item[k]) for k in ("run", "compensation") if k in item}}

    if "steps" in definition:
        return {**definition, "steps": [step(item) for item in definition["steps"]]}
    return step(definition)


def _validate_approval(where: str, approval) -> dict:
    if not isinstance(approval, dict):
        _fail(where, "must be an object")
    _unknown(where, approval, APPROVAL_FIELDS)
    normal = dict(approval)
    if "rules" in approval:
        if {"group", "required", "allow_self_approval"} & set(approval):
            _fail(where, "has rules, so group, required and allow_self_approval belong in "
                         "each rule")
        rules = approval["rules"]
        if not isinstance(rules, list) or not rules:
            _fail(where, "rules must be a non-empty list of rules")
        if len(rules) > RULES_LIMIT:
            _fail(where, f"has {len(rules)} rules; at most {RULES_LIMIT}")
        normal["rules"] = [_validate_rule(f"{where} rule {number}", rule)
                           for number, rule in enumerate(rules, 1)]
        # A gate none of whose rules matched would pass with nobody's approval.
        if all("when" in rule for rule in normal["rules"]):
            _fail(where, "every rule has a when: give at least one rule without when (it "
                         "always applies), or put the condition on the step's own when")
        labels = [rule["label"] for rule in normal["rules"]]
        if len(set(labels)) != len(labels):
            _fail(where, "two rules have the same label; give each a label of its own")
    else:
        _validate_rule(where, {field: approval[field] for field in (
            "group", "required", "allow_self_approval") if field in approval}, plain=True)
        normal = {"required": 1, "allow_self_approval": False, **normal}
    reject = approval.get("reject", "any")
    if reject not in REJECT_POLICIES:
        _fail(where, f"reject must be 'any' (one reject ends it) or 'quorum' (a rule's count "
                     f"of rejects ends it), got {reject!r}")
    _text(where, approval, "escalate_to")
    _number(where, approval, "timeout_seconds", positive=True)
    # Reminders sooner than a minute apart would be noise, not nudges.
    for field in ("remind_after_seconds", "remind_every_seconds"):
        _number(where, approval, field, positive=True)
        if approval.get(field, 60) < 60:
            _fail(where, f"{field} must be at least 60, got {approval[field]}")
    on_timeout = approval.get("on_timeout")
    if on_timeout is not None and on_timeout not in ("reject", "escalate"):
        _fail(where, f"on_timeout must be 'reject' or 'escalate', got {on_timeout!r}")
    if on_timeout and "timeout_seconds" not in approval:
        _fail(where, "on_timeout needs timeout_seconds")
    if on_timeout == "escalate" and not approval.get("escalate_to"):
        _fail(where, "on_timeout 'escalate' needs escalate_to (a group name)")
    if "signature" in approval:
        normal["signature"] = _validate_signature(where, approval["signature"])
    if "form" in approval:
        try:
            normal["form"] = check_fields(approval["form"], f"{where} form field")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if not normal["form"]:
            _fail(where, "form has no fields")
    return normal


def _validate_signature(where: str, signature) -> dict:
    """A gate's or a rule's `signature`: what signing an approval on it means, and what
    signing a rejection means (`reject_meaning`, "Rejected" unless it says)."""
    def fine(text) -> bool:
        return isinstance(text, str) and bool(text.strip()) and len(text) <= 200

    if (not isinstance(signature, dict) or not fine(signature.get("meaning"))
            or not set(signature) <= {"meaning", "reject_meaning"}
            or ("reject_meaning" in signature and not fine(signature["reject_meaning"]))):
        _fail(where, 'signature must be {"meaning": "what signing an approval means", '
                     '"reject_meaning": "what signing a rejection means" (optional, '
                     '"Rejected" by default)}, each 1 to 200 characters, e.g. {"meaning": '
                     '"Approved for release"}')
    normal = {"meaning": signature["meaning"].strip()}
    if "reject_meaning" in signature:
        normal["reject_meaning"] = signature["reject_meaning"].strip()
    return normal


def _validate_rule(where: str, rule, *, plain: bool = False) -> dict:
    """One approval rule (or, `plain`, a gate's own group, required and self-approval)."""
    if not isinstance(rule, dict):
        _fail(where, 'must be an object such as {"group": "finance", "required": 1}')
    _unknown(where, rule, RULE_FIELDS)
    manager = rule.get("manager", False)
    if not isinstance(manager, bool):
        _fail(where, "manager must be true or false")
    group = rule.get("group")
    if not isinstance(group, str) or not group.strip():
        _fail(where, "a manager rule needs a group too: it decides when the requester has no "
                     "manager on record" if manager else
              "group is required (the approver group's name)")
    _text(where, rule, "group")
    _text(where, rule, "label")
    required = rule.get("required", 1)
    if isinstance(required, bool) or not isinstance(required, int) or required < 1:
        _fail(where, f"required must be an integer of at least 1, got {required!r}")
    _number(where, rule, "required", integer=True)
    _number(where, rule, "order", integer=True)
    if manager and required != 1:
        _fail(where, "a manager rule is met by one person: required must be 1")
    if not isinstance(rule.get("allow_self_approval", False), bool):
        _fail(where, "allow_self_approval must be true or false")
    if "label" in rule and (not isinstance(rule["label"], str) or not rule["label"].strip()):
        _fail(where, "label must be a non-empty string")
    normal = {"required": required, "allow_self_approval": False, "order": 0, **rule}
    if not plain:
        normal["label"] = rule.get("label") or ("the requester's manager" if manager else group)
    if "when" in rule:
        normal["when"] = _validate_when(f"{where} when", rule["when"])
    if "signature" in rule:
        normal["signature"] = _validate_signature(where, rule["signature"])
    return normal


def _validate_when(where: str, when) -> dict:
    """A condition on the run's shared state or params: one place to look, one test."""
    if not isinstance(when, dict):
        _fail(where, 'must be an object such as {"state": "qa.rollout", "equals": "canary"}')
    _unknown(where, when, {*WHEN_SOURCES, *WHEN_TESTS})
    sources = [name for name in WHEN_SOURCES if name in when]
    tests = [name for name in WHEN_TESTS if name in when]
    if len(sources) != 1:
        _fail(where, "needs exactly one of state or params (where to look)")
    if len(tests) != 1:
        _fail(where, f"needs exactly one of {', '.join(WHEN_TESTS)} (what to test)")
    path, test = when[sources[0]], tests[0]
    if not isinstance(path, str) or not WHEN_PATH.match(path):
        _fail(where, f"{sources[0]} must be a dotted key such as 'qa.rollout', got {path!r}")
    value = when[test]
    scalar = (str, int, float, bool, type(None))
    if test == "exists" and not isinstance(value, bool):
        _fail(where, "exists must be true or false")
    if test == "in" and (not isinstance(value, list) or not value
                         or not all(isinstance(v, scalar) for v in value)):
        _fail(where, "in must be a non-empty list of values")
    if test in NUMERIC_TESTS and (isinstance(value, bool) or not isinstance(value, (int, float))):
        _fail(where, f"{test} compares numbers: it must be a number, got {value!r}")
    if test in ("equals", "not_equals") and not isinstance(value, scalar):
        _fail(where, f"{test} must be a string, number, true, false or null")
    if isinstance(value, float) and not math.isfinite(value):
        _fail(where, f"{test} must be a finite number")
    return {sources[0]: path, test: value}


def bare_step(index: int, title: str) -> dict:
    """A step given as its title alone: a wait step (someone reports it done), keyed by
    its title ("Review the diff" is `review-the-diff`)."""
    title = title.strip()
    if not title:
        _fail(f"step {index + 1}", "a step given as text needs a title, got an empty string")
    if len(title) > TEXT_LIMITS["title"]:
        _fail(f"step {index + 1}", f"title is longer than {TEXT_LIMITS['title']} characters")
    key = re.sub(r"[^a-z0-9_.-]+", "-", title.lower()).strip("-.")[:100] or f"step-{index + 1}"
    return {"key": key, "title": title}


def _validate_step(index: int, step) -> dict:
    if isinstance(step, str):
        step = bare_step(index, step)
    if not isinstance(step, dict):
        _fail(f"step {index + 1}", "must be an object, or a title (a wait step)")
    key = step.get("key")
    if not isinstance(key, str) or not key.strip():
        _fail(f"step {index + 1}", "missing key")
    if not KEY_PATTERN.match(key):
        _fail(f"step {key[:100]!r}", "key must be 1 to 100 letters, digits, '-', '_' or '.'")
    where = f"step {key!r}"
    if "account" in step:
        step = _account_into_run(where, step)
    _text(where, step, "title")
    _text(where, step, "description")
    _unknown(where, step, STEP_FIELDS)
    if "run" in step and "approval" in step:
        _fail(where, "needs at most one of run or approval (got both); a step with neither "
                     "waits for a report")
    depends_on = step.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        _fail(where, "depends_on must be a list of step keys")
    if key in depends_on:
        _fail(where, "depends on itself")
    if len(set(depends_on)) != len(depends_on):
        _fail(where, "depends_on lists a step twice")
    if "title" in step and not isinstance(step["title"], str):
        _fail(where, "title must be a string")
    _number(where, step, "max_retries", integer=True)
    _number(where, step, "retry_backoff_seconds")
    _number(where, step, "retry_backoff_max_seconds")
    if step.get("retry_backoff", "fixed") not in BACKOFF_KINDS:
        _fail(where, f"retry_backoff must be one of {sorted(BACKOFF_KINDS)}")
    if not isinstance(step.get("continue_on_failure", False), bool):
        _fail(where, "continue_on_failure must be true or false")
    normal = {**step, "title": step.get("title") or key, "depends_on": depends_on}
    if ("timeout_seconds" in step or "on_timeout" in step) and (
            "run" in step or "approval" in step):
        _fail(where, "timeout_seconds and on_timeout at the step belong to a wait step (put "
                     "them in run or approval)")
    if "run" in step:
        normal["run"] = _validate_action(f"{where} run", step["run"])
    elif "approval" in step:
        normal["approval"] = _validate_approval(f"{where} approval", step["approval"])
        if "max_retries" in step or "compensation" in step:
            _fail(where, "an approval step has no retries or compensation")
    else:  # a wait step: an agent, a person or another system reports it
        if "max_retries" in step or "compensation" in step:
            _fail(where, "a wait step has no retries or compensation")
        _number(where, step, "timeout_seconds", positive=True)
        if step.get("on_timeout", "fail") not in WAIT_OUTCOMES:
            _fail(where, f"on_timeout must be one of {', '.join(WAIT_OUTCOMES)}")
        if "on_timeout" in step and "timeout_seconds" not in step:
            _fail(where, "on_timeout needs timeout_seconds")
    if "compensation" in step:
        normal["compensation"] = _validate_action(f"{where} compensation", step["compensation"],
                                                  compensation=True)
    if "when" in step:
        if "approval" in step:
            _fail(where, "a gate cannot have when: a gate is never skipped (put the condition "
                         "on the work steps of the branch; the gate after them still waits)")
        normal["when"] = _validate_when(f"{where} when", step["when"])
    return normal


def _account_into_run(where: str, step: dict) -> dict:
    """`account` where the seed puts it, on the step: Tollgate keeps it on the action that
    runs under it, so it is moved there, or refused saying where it goes."""
    run = step.get("run")
    if not isinstance(run, dict) or not {"command", "shell", "agent"} & set(run):
        _fail(where, "account goes with a command, shell or agent the step runs (in its run: "
                     '{"run": {"command": [...], "account": {"profile": "work"}}}); this step '
                     "runs none")
    if "account" in run or (isinstance(run.get("agent"), dict) and "account" in run["agent"]):
        _fail(where, "account is given twice, on the step and in its run: keep one")
    return {**{k: v for k, v in step.items() if k != "account"},
            "run": {**run, "account": step["account"]}}


def check_grants(spec: str, steps: list[dict]) -> None:
    """SpecError naming the first step that names a secret not granted to `spec`."""
    for step in steps:
        for where, secret in grants.secrets_named(step):
            if not grants.granted(spec, secret):
                _fail(where, grants.refusal(spec, secret))


def validate_step(index: int, step) -> dict:
    """One step, validated and normalised as in a spec (for steps added to a running run)."""
    return _validate_step(index, step)


def spec_problems(data) -> list[str]:
    """Every problem of a spec at once, for a form to show together: the spec's own fields,
    each step's problems (an unknown field, then what is wrong with the rest of it), and
    what only the whole spec shows (duplicate keys, unknown dependencies, cycles). Empty
    when the spec is valid."""
    try:
        validate_spec(data)
        return []
    except SpecError as exc:
        first = str(exc)
    if not isinstance(data, dict):
        return [first]
    problems = []
    try:  # the spec's own fields, with a step that is surely valid
        validate_spec({**{k: v for k, v in data.items() if k != "steps"},
                       "steps": [{"key": "step"}]})
    except SpecError as exc:
        problems.append(str(exc))
    steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    valid, keys = [], []
    for index, step in enumerate(steps):
        if isinstance(step, dict) and isinstance(step.get("key"), str):
            keys.append(step["key"])
        problems.extend(_step_problems(index, step, valid))
    for key in sorted({key for key in keys if keys.count(key) > 1}):
        problems.append(f"step {key!r}: duplicate key")
    for step in valid:
        for dep in step["depends_on"]:
            if dep not in keys:
                problems.append(f"step {step['key']!r}: depends_on names unknown step {dep!r}")
    if not problems:
        return [first]
    return problems if first in problems else [first, *problems]


def _step_problems(index: int, step, valid: list) -> list[str]:
    """A step's problems: an unknown field first, then the first problem of the rest."""
    problems = []
    if isinstance(step, dict):
        unknown = sorted(set(step) - STEP_FIELDS - {"account"})
        if unknown and isinstance(step.get("key"), str):
            problems.append(f"step {step['key']!r}: unknown field {unknown[0]!r} (allowed: "
                            f"{', '.join(sorted(STEP_FIELDS))})")
            step = {k: v for k, v in step.items() if k in STEP_FIELDS}
    try:
        valid.append(_validate_step(index, step))
    except SpecError as exc:
        problems.append(str(exc))
    return problems


def _find_cycle(steps: list[dict]) -> str | None:
    graph = {s["key"]: s["depends_on"] for s in steps}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(key: str) -> str | None:
        state[key] = 1
        for dep in graph[key]:
            if state.get(dep) == 1:
                return dep
            if state.get(dep) is None and (found := visit(dep)):
                return found
        state[key] = 2
        return None

    for key in graph:
        if state.get(key) is None and (found := visit(key)):
            return found
    return None


def validate_spec(data) -> dict:
    """Return the normalised spec, or raise SpecError naming the step and the problem."""
    if not isinstance(data, dict):
        raise SpecError("spec: must be a JSON object")
    _unknown("spec", data, TOP_FIELDS)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError("spec: name is required")
    from django.core.validators import validate_slug

    try:
        validate_slug(name)
    except Exception:
        raise SpecError(f"spec: name {name!r} must be letters, digits, - or _") from None
    if "version" in data and (isinstance(data["version"], bool)
                              or not isinstance(data["version"], int) or data["version"] < 1):
        raise SpecError("spec: version must be a positive integer")
    if not isinstance(data.get("description", ""), str):
        raise SpecError("spec: description must be a string")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise SpecError("spec: has no steps")
    if len(steps) > settings.TOLLGATE_MAX_STEPS_PER_RUN:
        raise SpecError(f"spec: {len(steps)} steps; a run holds at most "
                        f"{settings.TOLLGATE_MAX_STEPS_PER_RUN} (TOLLGATE_MAX_STEPS_PER_RUN)")
    normal_steps = []
    seen: set[str] = set()
    for index, step in enumerate(steps):
        normal = _validate_step(index, step)
        if normal["key"] in seen:
            _fail(f"step {normal['key']!r}", "duplicate key")
        seen.add(normal["key"])
        normal_steps.append(normal)
    for step in normal_steps:
        for dep in step["depends_on"]:
            if dep not in seen:
                _fail(f"step {step['key']!r}", f"depends_on names unknown step {dep!r}")
        if (step.get("run") or {}).get("workflow") == name:
            _fail(f"step {step['key']!r} run", "a spec cannot run itself as a child workflow")
    if cycle_at := _find_cycle(normal_steps):
        _fail(f"step {cycle_at!r}", "is part of a dependency cycle")
    check_grants(name, normal_steps)
    normal = {"name": name, "description": data.get("description", ""), "steps": normal_steps}
    if "max_parallel" in data:
        _number("spec", data, "max_parallel", integer=True, positive=True)
        normal["max_parallel"] = data["max_parallel"]
    if "params" in data:
        try:
            normal["params"] = check_fields(data["params"], "spec params")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    return normal


def digest(definition: dict) -> str:
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def parse_spec_file(path: str | Path) -> dict:
    """Read a JSON (or YAML) spec file; SpecError if it cannot be parsed."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: invalid YAML ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                        f"{exc.msg}") from None

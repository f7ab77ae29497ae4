"""Spec validation: every refusal names the step and the problem, and stores nothing."""

from __future__ import annotations

import copy
import json

import pytest

from tests.conftest import RELEASE
from workflows.models import WorkflowSpec
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec


def spec_with(*steps, **top):
    return {"name": "s", "steps": list(steps), **top}


def run_step(key, **extra):
    return {"key": key, "run": {"command": ["true"]}, **extra}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (spec_with(), "spec: has no steps"),
        ({"steps": [run_step("a")]}, "spec: name is required"),
        (spec_with({"run": {"command": ["true"]}}), "step 1: missing key"),
        (spec_with(run_step("a"), run_step("a")), "step 'a': duplicate key"),
        (spec_with(run_step("a", depends_on=["ghost"])),
         "step 'a': depends_on names unknown step 'ghost'"),
        (spec_with(run_step("a", depends_on=["a"])), "step 'a': depends on itself"),
        (spec_with(run_step("a", depends_on=["c"]), run_step("b", depends_on=["a"]),
                   run_step("c", depends_on=["b"])), "is part of a dependency cycle"),
        (spec_with(run_step("a", colour="red")), "step 'a': unknown field 'colour'"),
        (spec_with({"key": "a", "run": {"command": "make build"}}),
         "step 'a' run: command must be a list of arguments, not a string"),
        (spec_with({"key": "a", "on_timeout": "skip"}),
         "step 'a': on_timeout needs timeout_seconds"),
        (spec_with({"key": "a", "run": {"command": ["x"]}, "approval": {"group": "qa"}}),
         "step 'a': needs at most one of run or approval (got both)"),
        (spec_with({"key": "a", "approval": {"group": "qa", "required": 0}}),
         "step 'a' approval: required must be an integer of at least 1"),
        (spec_with(run_step("a", max_retries=-1)), "step 'a': max_retries must not be negative"),
        (spec_with({"key": "a", "run": {"command": ["x"], "timeout_seconds": -5}}),
         "step 'a' run: timeout_seconds must not be negative"),
        (spec_with({"key": "a", "run": {"callable": "os.system"}}),
         "step 'a' run: callable 'os.system' is not on the allow-list"),
        (spec_with({"key": "a", "run": {"command": ["x"], "shell": "x"}}),
         "step 'a' run: needs exactly one of command, shell, callable, agent or workflow (got "
             "command, shell)"),
        (spec_with({"key": "a", "approval": {}}), "step 'a' approval: group is required"),
        (spec_with(run_step("a", compensation={"command": "undo"})),
         "step 'a' compensation: command must be a list"),
        ({"name": "s", "steps": [run_step("a")], "extra": 1}, "spec: unknown field 'extra'"),
    ],
)
def test_invalid_specs_are_refused_with_where_and_what(db, spec, message):
    with pytest.raises(SpecError) as error:
        store_spec(spec)
    assert message in str(error.value)
    assert not WorkflowSpec.objects.exists()


def test_cycle_names_a_step_in_it():
    spec = spec_with(run_step("a"), run_step("b", depends_on=["c"]),
                     run_step("c", depends_on=["b"]))
    with pytest.raises(SpecError, match=r"step '(b|c)': is part of a dependency cycle"):
        validate_spec(spec)


def test_valid_spec_is_normalised():
    spec = validate_spec(copy.deepcopy(RELEASE))
    assert [s["key"] for s in spec["steps"]] == ["build", "qa", "deploy", "notify"]
    assert spec["steps"][0]["title"] == "Build"
    assert spec["steps"][3]["title"] == "notify"
    assert spec["steps"][1]["approval"]["allow_self_approval"] is False


def test_shell_and_allowed_callable_are_accepted():
    validate_spec(spec_with({"key": "a", "run": {"shell": "echo hi | wc -c"}},
                            {"key": "b", "run": {"callable": "workflows.callables.noop"}}))


def test_changed_spec_becomes_new_active_version(db):
    first, created = store_spec(RELEASE)
    assert created and first.version == 1
    same, created = store_spec(copy.deepcopy(RELEASE))
    assert not created and same.pk == first.pk
    changed = copy.deepcopy(RELEASE)
    changed["description"] = "Now with more QA"
    second, created = store_spec(changed)
    assert created and second.version == 2
    first.refresh_from_db()
    assert first.status == "archived" and second.status == "active"


def test_runs_keep_their_version(db):
    from workflows import engine

    first = store_spec(RELEASE)[0]
    run = engine.open_run("release").run
    changed = copy.deepcopy(RELEASE)
    changed["steps"] = changed["steps"][:1]
    store_spec(changed)
    run.refresh_from_db()
    assert run.spec == first and run.steps.count() == 4
    assert engine.open_run("release").run.steps.count() == 1


def test_one_active_version_is_enforced_by_the_database(db):
    from django.db import IntegrityError, transaction

    spec = store_spec(RELEASE)[0]
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkflowSpec.objects.create(name=spec.name, version=9, definition=spec.definition,
                                    digest="x")


def test_yaml_and_json_files(tmp_path):
    from workflows.specs.validation import parse_spec_file

    (tmp_path / "a.json").write_text(json.dumps(RELEASE))
    (tmp_path / "b.yaml").write_text("name: b\nsteps:\n  - key: x\n    run: {command: [echo]}\n")
    (tmp_path / "bad.json").write_text("{nope")
    assert parse_spec_file(tmp_path / "a.json")["name"] == "release"
    assert parse_spec_file(tmp_path / "b.yaml")["steps"][0]["key"] == "x"
    with pytest.raises(SpecError, match="invalid JSON at line 1"):
        parse_spec_file(tmp_path / "bad.json")


def test_an_account_on_the_step_goes_with_what_it_runs_or_is_refused_saying_where():
    account = {"profile": "work"}
    [command, agent] = validate_spec({"name": "acc", "steps": [
        {"key": "c", "account": account, "run": {"command": ["true"]}},
        {"key": "a", "account": account, "run": {"agent": {"provider": "claude",
                                                           "prompt": "go"}}}]})["steps"]
    assert "account" not in command and command["run"]["account"]["profile"] == "work"
    assert agent["run"]["account"]["profile"] == "work"
    for step, says in (
            ({"key": "g", "account": account, "approval": {"group": "qa"}},
             "account goes with a command, shell or agent"),
            ({"key": "w", "account": account}, "account goes with a command"),
            ({"key": "c", "account": account,
              "run": {"command": ["true"], "account": account}}, "given twice")):
        with pytest.raises(SpecError, match=says):
            validate_spec({"name": "acc", "steps": [step]})


def test_a_pending_step_shows_the_account_it_will_run_under(client, people):
    from workflows import engine

    store_spec({"name": "acct", "steps": [
        {"key": "build", "run": {"command": ["true"]}},
        {"key": "ship", "depends_on": ["build"], "account": {"profile": "deploy"},
         "run": {"agent": {"provider": "claude", "prompt": "ship it"}}},
        {"key": "tag", "depends_on": ["build"],
         "run": {"command": ["true"], "account": {"profile": "ci", "tool": "acct"}}}]})
    run = engine.open_run("acct", actor=people["alice"]).run
    client.force_login(people["alice"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "runs under account deploy" in page and "runs under account ci (acct)" in page

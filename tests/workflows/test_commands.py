"""load_workflow, start_run and demo as the contract describes them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from workflows.models import Run, WorkflowSpec

from ..conftest import RELEASE

pytestmark = pytest.mark.django_db


def call(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_load_workflow_prints_name_and_version(tmp_path):
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE))
    assert call("load_workflow", str(path))[0] == "release v1\n"
    assert call("load_workflow", str(path))[0] == "release v1\n"
    path.write_text(json.dumps({**RELEASE, "description": "changed"}))
    assert call("load_workflow", str(path))[0] == "release v2\n"


def test_load_workflow_stores_a_file_under_another_name(tmp_path):
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE))
    assert call("load_workflow", str(path), "--name", "release-eu")[0] == "release-eu v1\n"
    assert call("load_workflow", str(path))[0] == "release v1\n"
    assert set(WorkflowSpec.objects.values_list("name", flat=True)) == {"release", "release-eu"}
    with pytest.raises(CommandError, match="give one file, not 2"):
        call("load_workflow", str(path), str(path), "--name", "x")
    path.write_text(json.dumps(RELEASE))
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError):
        call_command("load_workflow", str(path), "--name", "Not A Slug!", stdout=out,
                     stderr=err)
    assert "name" in err.getvalue() and not WorkflowSpec.objects.filter(
        name="Not A Slug!").exists()


def test_load_workflow_refuses_invalid_file_and_stores_nothing_from_it(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(RELEASE))
    bad.write_text(json.dumps({"name": "bad", "steps": [{"key": "a", "depends_on": ["a"],
                                                          "run": {"command": ["x"]}}]}))
    with pytest.raises(CommandError, match="1 of 2 spec file"):
        call("load_workflow", str(good), str(bad))
    assert list(WorkflowSpec.objects.values_list("name", flat=True)) == ["release"]


def test_load_workflow_error_names_file_step_and_problem(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "steps": [{"key": "a", "depends_on": ["a"],
                                                          "run": {"command": ["x"]}}]}))
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("load_workflow", str(bad), stdout=StringIO(), stderr=err)
    assert f"{bad}: step 'a': depends on itself" in err.getvalue()


def test_start_run_prints_id_and_reuses_by_key(release_spec):
    out, _ = call("start_run", "release", "--idempotency-key", "nightly-1",
                  "--state", '{"branch": "main"}')
    run = Run.objects.get(pk=int(out))
    assert run.shared_state == {"branch": "main"}
    again, err = call("start_run", "release", "--idempotency-key", "nightly-1")
    assert again == out and "Reused run" in err


@pytest.mark.parametrize(("args", "message"), [
    (["nope"], "No active spec named 'nope'"),
    (["release", "--goal", "999"], "Goal 999 does not exist"),
    (["release", "--state", "{bad"], "--state is not valid JSON"),
    (["release", "--state", "[1]"], "shared_state must be a JSON object"),
])
def test_start_run_errors(release_spec, args, message):
    with pytest.raises(CommandError, match=message):
        call("start_run", *args)
    assert not Run.objects.exists()


def test_demo_is_idempotent_and_covers_every_run_state():
    out, _ = call("demo")
    assert "alice" in out and "tollgate-demo" in out
    counts = Run.objects.count()
    call("demo")
    assert Run.objects.count() == counts
    assert set(Run.objects.values_list("status", flat=True)) == {
        "open", "running", "blocked", "waiting_approval", "failed", "completed", "cancelled"}


def test_create_token_prints_a_working_token(people):
    from django.test import Client

    out, _ = call("create_token", "bob", "--name", "ci")
    token = out.strip()
    assert token.startswith("tg_")
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/runs").status_code == 200
    with pytest.raises(CommandError, match="No user named 'ghost'"):
        call("create_token", "ghost")


def test_runs_lists_with_filters(release_spec):
    from workflows import engine

    run = engine.open_run(release_spec, title="Listed").run
    out, _ = call("runs", "--status", "open")
    assert f"{run.pk:>6}  open" in out
    assert "(no runs)" in call("runs", "--status", "failed")[0]
    with pytest.raises(CommandError, match="No spec named 'nope'"):
        call("runs", "--spec", "nope")
    with pytest.raises(CommandError, match="Goal 42 does not exist"):
        call("runs", "--goal", "42")


def test_resume_says_where_a_run_stands(release_spec):
    from workflows import engine

    run = engine.open_run(release_spec).run
    out, _ = call("resume", str(run.pk))
    assert out == "ready: Build is ready to start.\nnext step: build\n"
    assert json.loads(call("resume", str(run.pk), "--json")[0])["can_resume"] is True
    with pytest.raises(CommandError, match="Run 999 does not exist"):
        call("resume", "999")
    with pytest.raises(CommandError, match="Run abc does not exist"):
        call("resume", "abc")


def test_resume_pages_the_timeline_newest_first(release_spec):
    from tests.workflows.helpers import work
    from workflows import engine

    run = engine.open_run(release_spec).run
    work(run, "build")  # seq 2 started, 3 completed (the gate opens with it)
    out, _ = call("resume", str(run.pk), "--timeline", "2")
    lines = out.splitlines()[2:]
    assert [line.split()[0] for line in lines] == ["#3", "#2"]
    older = json.loads(call("resume", str(run.pk), "--timeline", "5", "--before", "2",
                            "--json")[0])["timeline"]
    assert [c["seq"] for c in older] == [1] and older[0]["kind"] == "run_opened"
    oldest = json.loads(call("resume", str(run.pk), "--timeline", "2", "--oldest",
                             "--json")[0])["timeline"]
    assert [c["seq"] for c in oldest] == [1, 2]


def test_start_run_with_caller_fields_and_inline_steps(db, tmp_path):
    from workflows.models import Run

    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"key": "draft"}, {"key": "send", "depends_on": ["draft"]}]))
    out, _ = call("start_run", "one-off", "--steps", str(steps), "--kind", "agent",
                  "--ref", "SESSION-9", "--next-action", "write the draft")
    run = Run.objects.get(pk=int(out))
    assert (run.kind, run.ref, run.what_next) == ("agent", "SESSION-9", "write the draft")
    assert run.spec.status == "one_off" and run.steps.count() == 2
    listed = call("runs", "--ref", "SESSION-9", "--open", "--status", "open",
                  "--status", "running")[0]
    assert f"{run.pk:>6}  open" in listed and "write the draft" in listed
    assert "(no runs)" in call("runs", "--ref", "SESSION-1")[0]
    steps.write_text("[{\"key\": \"a\", \"depends_on\": [\"b\"]}]")
    with pytest.raises(CommandError, match="unknown step 'b'"):
        call("start_run", "one-off", "--steps", str(steps))

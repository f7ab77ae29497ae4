"""In Debian's chromium: start a run with params from the Start page, skip a work step with a
reason, and search the runs."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from workflows import engine
from workflows.models import Run
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DEPLOY = {"name": "deploy", "description": "Ship a version", "params": [
    {"name": "version", "type": "string", "required": True, "description": "what to ship"},
    {"name": "rollout", "type": "choice", "options": ["canary", "full"], "default": "canary"},
    {"name": "dry_run", "type": "boolean"},
], "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA", "depends_on": ["build"], "approval": {"group": "qa"}},
]}


@pytest.fixture
def deploy(people):
    people["alice"].user_permissions.add(Permission.objects.get(codename="add_run"))
    return store_spec(DEPLOY)[0]


def test_start_a_run_with_params(page, shoot, deploy):
    login(page, "alice")
    page.click("nav >> text=Start")
    page.click("text=Start run")
    page.fill("input[name=param_version]", "2.1")
    page.select_option("select[name=param_rollout]", "full")
    page.check("input[name=param_dry_run]")
    page.fill("input[name=title]", "Ship 2.1")
    shoot("start-run")
    page.click("button:has-text('Start run')")
    page.wait_for_selector("h1 >> text=Ship 2.1")
    run = Run.objects.get()
    assert run.params == {"version": "2.1", "rollout": "full", "dry_run": True}
    shown = page.eval_on_selector_all(".params dt, .params dd", "els => els.map(e => "
                                      "e.textContent)")
    assert shown == ["version", "2.1", "rollout", "full", "dry_run", "yes"]


def test_a_missing_required_param_is_shown_beside_it(page, deploy):
    login(page, "alice")
    page.goto("/specs/deploy/start/")
    page.evaluate("document.querySelectorAll('[required]').forEach(e => "
                  "e.removeAttribute('required'))")
    page.click("button:has-text('Start run')")
    page.wait_for_selector(".field.invalid >> text=This field is required.")
    assert not Run.objects.exists()


def test_skip_a_step_with_a_reason(page, shoot, deploy, people):
    run = engine.open_run(deploy, actor=people["alice"], params={"version": "1"}).run
    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    page.fill("#step-build textarea[aria-label^='Why skip']", "built by CI already")
    page.click("#step-build button:has-text('Skip')")
    page.wait_for_selector("text=Build skipped.")
    page.wait_for_selector("#step-qa .status >> text=waiting for approval")
    shoot("run-skipped")
    assert run.steps.get(key="build").status == "skipped"


def test_search_runs(page, deploy, people):
    engine.open_run(deploy, actor=people["alice"], params={"version": "1"}, title="Nightly 7")
    engine.open_run(deploy, actor=people["alice"], params={"version": "2"}, title="Hotfix 3")
    login(page, "dave")
    page.goto("/runs/")
    page.fill("input[name=q]", "hotfix")
    page.click("button:has-text('Filter')")
    page.wait_for_selector("text=Hotfix 3")
    assert "Nightly 7" not in page.inner_text("table.runs")
    assert "q=hotfix" in page.url

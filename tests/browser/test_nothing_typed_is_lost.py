"""Nothing typed is lost: the run page and the inbox update around what a person types."""

from __future__ import annotations

import pytest

from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Approval
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TWO_KEYS = {"name": "two-keys", "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "lint", "title": "Lint", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa", "required": 2}},
]}


@pytest.fixture
def run(people):
    store_spec(TWO_KEYS)
    run = engine.open_run("two-keys", actor=people["alice"], title="Ship 4.0").run
    work(run, "build")
    return run


def test_the_run_page_keeps_what_is_typed_while_others_decide_and_steps_finish(
        page, run, people):
    login(page, "carol")
    page.goto(f"/runs/{run.pk}/")
    page.evaluate("window.__noReload = true")
    approve = "#step-qa textarea[aria-label^='Approval comment']"
    reject = "#step-qa textarea[aria-label^='Why reject']"
    page.fill(reject, "if it fails: the canary")
    page.fill(approve, "checked the dashboards,\nall green")
    engine.approve(run, "qa", user=people["bob"])  # another approver, 1 of 2
    engine.start_step(run, "lint")
    engine.complete_step(run, "lint", summary="lint clean")  # a worker finishes a step
    page.wait_for_selector("#step-qa >> text=bob")
    page.wait_for_selector("#step-lint .status >> text=completed")
    assert page.input_value(approve) == "checked the dashboards,\nall green"
    assert page.input_value(reject) == "if it fails: the canary"
    # The field being typed in keeps the focus through the update.
    assert page.evaluate("document.activeElement.getAttribute('aria-label')").startswith(
        "Approval comment")
    assert page.evaluate("window.__noReload") is True
    page.keyboard.press("Enter")  # sends the comment's form
    page.wait_for_selector("text=You approved QA sign-off")
    assert Approval.objects.get(user=people["carol"]).comment == (
        "checked the dashboards,\nall green")


def test_a_refused_reject_keeps_the_cards_approval_comment(page, run, people):
    login(page, "carol")
    gate = run.steps.get(key="qa").pk
    page.fill(f"#gate-{gate} textarea[aria-label^='Approval comment']", "half written")
    page.evaluate(f"document.querySelectorAll('#gate-{gate} [required]')"
                  ".forEach(e => e.removeAttribute('required'))")
    page.click(f"#gate-{gate} button.danger")
    page.wait_for_selector(f"#gate-{gate} [role=alert] >> text=A comment is required")
    assert page.input_value(f"#gate-{gate} textarea[aria-label^='Approval comment']") == \
        "half written"


def test_the_bulk_comment_and_ticks_survive_an_arriving_gate_and_a_refusal(page, run,
                                                                            people):
    second = engine.open_run("two-keys", actor=people["alice"], title="Ship 4.1").run
    work(second, "build")
    login(page, "carol")
    gates = [r.steps.get(key="qa").pk for r in (run, second)]
    bulk = "textarea[aria-label='Comment for the selected gates']"
    page.fill(bulk, "both checked on staging")
    for pk in gates:
        page.check(f"#pick-{pk}")
    third = engine.open_run("two-keys", actor=people["alice"], title="Ship 4.2").run
    work(third, "build")
    page.wait_for_selector(f"#gate-{third.steps.get(key='qa').pk}")
    # The arrival is said aloud, and nothing typed or ticked was lost.
    page.wait_for_selector("#live >> text=New gate: QA sign-off")
    assert page.input_value(bulk) == "both checked on staging"
    assert all(page.is_checked(f"#pick-{pk}") for pk in gates)
    # Times keep counting on the page: a card that says "waiting 2 s" says more later (the
    # moment it counts from moved back five minutes here, rather than waiting for them).
    page.evaluate(f"document.querySelector('#gate-{gates[0]} .age time').dataset.since = "
                  "new Date(Date.now() - 300000).toISOString()")
    page.wait_for_selector(f"#gate-{gates[0]} .age >> text=waiting 5 min")
    page.fill(bulk, "")
    page.click("button:has-text('Reject selected')")  # refused: a reject needs a comment
    page.wait_for_selector("[role=alert] >> text=comment")
    assert all(page.is_checked(f"#pick-{pk}") for pk in gates)
    assert not Approval.objects.exists()

"""An approver with many gates works through them by deadline from the keyboard, in
Chromium: the sort and a filter from the inbox's form (kept in the URL), j / k between
cards, a to approve, r to write a rejection, ? for the keys."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workflows import engine
from workflows.models import Approval, Step
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def three_gates(people):
    """bob's three qa gates: the oldest has the latest deadline."""
    store_spec({"name": "release", "steps": [
        {"key": "qa", "title": "QA sign-off",
         "approval": {"group": "qa", "timeout_seconds": 86400}}]})
    store_spec({"name": "payroll", "steps": [
        {"key": "qa", "title": "Payroll check", "approval": {"group": "qa"}}]})
    runs = []
    for hours, name in ((3, "release"), (2, "release"), (1, "payroll")):
        run = engine.open_run(name, actor=people["alice"], title=f"{name} {hours}h").run
        since = timezone.now() - timedelta(hours=hours)
        due = {3: timedelta(hours=10), 2: timedelta(hours=1)}.get(hours)
        Step.objects.filter(run=run).update(waiting_since=since,
                                            deadline_at=timezone.now() + due if due else None)
        runs.append(run)
    return runs


def gate_ids(page) -> list[str]:
    return page.eval_on_selector_all("#gate-list article.card.gate", "els => els.map(e => e.id)")


def test_sort_filter_and_decide_from_the_keyboard(page, three_gates):
    oldest, newer, payroll = ([f"gate-{run.steps.get().pk}" for run in three_gates])
    login(page, "bob")
    page.goto("/")
    assert gate_ids(page) == [oldest, newer, payroll]

    page.select_option("select[name=sort]", "deadline")
    page.click("form.inbox-view button:has-text('Show')")
    page.wait_for_url("**/?sort=deadline*")
    # newer is due in an hour, oldest in ten, payroll never.
    assert gate_ids(page) == [newer, oldest, payroll]
    page.select_option("select[name=spec]", "release")
    page.click("form.inbox-view button:has-text('Show')")
    page.wait_for_url("**spec=release*")
    assert gate_ids(page) == [newer, oldest]
    page.goto("/?sort=deadline")

    page.keyboard.press("?")
    assert page.is_visible("#inbox-keys")
    assert "next gate" in page.inner_text("#inbox-keys")
    page.keyboard.press("Escape")
    assert not page.is_visible("#inbox-keys")

    page.keyboard.press("j")
    assert page.get_attribute(f"#{newer}", "class").endswith("current")
    page.keyboard.press("j")
    page.keyboard.press("k")
    page.keyboard.press("j")
    assert "current" in page.get_attribute(f"#{oldest}", "class")
    assert "current" not in page.get_attribute(f"#{newer}", "class")

    page.keyboard.press("a")  # approve the current one: it turns into its decided state
    page.wait_for_selector(f"#{oldest}.decided >> text=You approved QA sign-off")
    assert Approval.objects.get().step.run_id == three_gates[0].pk
    # The next waiting card is current now: a, r and j go on from it.
    page.wait_for_selector(f"#{payroll}.current")
    assert page.evaluate("document.activeElement.id") == payroll

    page.keyboard.press("k")  # up from there: past the decided card, to the one above
    assert "current" in page.get_attribute(f"#{newer}", "class")
    page.keyboard.press("r")  # the reason first: a rejection needs one
    assert page.evaluate("document.activeElement.getAttribute('aria-label')").startswith(
        "Why reject")
    page.keyboard.type("Staging is red")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#{newer}.decided >> text=You rejected QA sign-off")
    page.wait_for_selector(f"#{payroll}.current")  # the one still waiting
    decisions = {a.step.run_id: (a.decision, a.comment) for a in Approval.objects.all()}
    assert decisions[three_gates[1].pk] == ("reject", "Staging is red")
    assert three_gates[2].pk not in decisions  # payroll still waits

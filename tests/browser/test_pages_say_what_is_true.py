"""The pages say exactly what is true, in a real browser at phone and desktop width: the page a
mailed link opens names who else may decide; a manager stage names the manager and why; the
delegate's card and the away person's inbox say who stands in for whom; no page reads "( ",
"Approve Approve" or "waits on :"; and each of these pages passes axe."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import links
from workflows.models import Preference
from workflows.specs.storage import store_spec
from workflows.timing import clock

from .conftest import login
from .test_accessibility import violations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAYMENT = {"name": "payment", "params": [{"name": "amount", "type": "number"}], "steps": [
    {"key": "prepare", "title": "Prepare", "run": {"command": ["true"]}},
    {"key": "approve", "title": "Approve the payment", "depends_on": ["prepare"],
     "description": "Pay {{ params.amount }}.",
     "approval": {"rules": [
         {"group": "qa", "label": "QA", "order": 0},
         {"manager": True, "group": "qa", "label": "the requester's manager", "order": 1}]}}]}
WRONG = re.compile(r"\( |Approve Approve|waits on :|waiting on :| :")


@pytest.mark.parametrize("width", [390, 1280])
def test_stages_audiences_and_delegation_read_true(browser, live_server, people, width):
    Preference.objects.create(user=people["alice"], manager=people["dave"])
    Preference.objects.create(user=people["carol"], away_from=clock.now() - timedelta(hours=1),
                              away_until=clock.now() + timedelta(days=2),
                              delegate=people["erin"])
    store_spec(PAYMENT)
    run = engine.open_run("payment", actor=people["alice"], params={"amount": 24000}).run
    work(run, "prepare")
    gate = run.steps.get(key="approve")
    context = browser.new_context(base_url=live_server.url,
                                  viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        problems = {}

        def visit(url, name):
            page.goto(url)
            text = page.inner_text("main")
            assert not WRONG.search(text), (name, WRONG.search(text).group(),
                                            text[:2000])
            problems[name] = violations(page)
            return text

        # erin stands in for carol: her card says so before she decides.
        login(page, "erin")
        inbox = visit("/", "delegate's inbox")
        assert "You decide this for carol, who is away until" in inbox
        assert "24,000" in inbox
        decide = visit(f"/decide/{links.decision_token(people['erin'], gate)}/",
                       "decision page")
        assert "2 others may decide" in decide and "Also may decide" in page.content()
        assert "Pay 24,000." in decide  # the value filled in reads as the param does
        assert "for a decision on several gates" not in decide  # one gate: no bulk box
        page.context.clear_cookies()

        login(page, "carol")
        own = visit("/", "away person's inbox")
        assert "You are away until" in own and "erin decides your gates meanwhile" in own
        page.context.clear_cookies()

        login(page, "bob")
        visit("/", "approver's inbox")
        page.click(f"#gate-{gate.pk} .decide form:first-child button.primary")
        page.wait_for_selector(f"#gate-{gate.pk}.decided")
        run_page = visit(f"/runs/{run.pk}/", "run page")
        assert "dave (alice's manager)" in run_page
        assert "waiting on" in run_page or "waiting for approval" in run_page
        assert {name: found for name, found in problems.items() if found} == {}
    finally:
        context.close()


@pytest.mark.parametrize("width", [1280, 1440])
def test_the_reassign_form_shows_its_button_at_desktop_widths(browser, live_server, people,
                                                               release_spec, width):
    """Opened on the run page, the form's button is on screen (not past the table's edge,
    where only a sideways scroll would find it), and a refusal names the gate's title."""
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    context = browser.new_context(base_url=live_server.url,
                                  viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        login(page, "alice")  # an operator
        page.goto(f"/runs/{run.pk}/")
        page.click("#step-qa details.reassign summary")
        button = page.locator("#step-qa details.reassign button")
        box = button.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box
        assert button.evaluate("""b => {
            const r = b.getBoundingClientRect();
            const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
            return hit === b || b.contains(hit);
        }""")
        page.fill("#step-qa details.reassign input[name=person]", "alice")
        page.fill("#step-qa details.reassign textarea", "covering")
        button.click()
        page.wait_for_selector(".notice.error")
        assert "cannot decide QA sign-off: reassign it to someone else" in page.inner_text(
            "main")
    finally:
        context.close()


def test_every_navigation_link_is_in_sight_on_a_phone(browser, live_server, django_user_model):
    """At 390 px the navigation wraps: no link is scrolled out of sight with no sign of it."""
    django_user_model.objects.create_superuser("root", "root@example.com", "pw-root")
    context = browser.new_context(base_url=live_server.url, viewport={"width": 390,
                                                                      "height": 800})
    page = context.new_page()
    try:
        login(page, "root")
        links = page.evaluate("""() => [...document.querySelectorAll("nav[aria-label=Main] a")]
            .map(a => [a.innerText.trim(), a.getBoundingClientRect().right])""")
        assert len(links) >= 8, links  # every page a superuser has, Deadlines to Admin
        assert [name for name, right in links if right > 390] == []
    finally:
        context.close()

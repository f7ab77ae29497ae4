"""Every page passes the accessibility engine (axe-core) with no serious or critical
violation, at phone and desktop width: names for every control, landmarks, contrast; and,
whatever axe rates them, headings in order, every landmark and table header named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workflows.helpers import work
from workflows import engine
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parents[1] / "support" / "axe" / "node_modules" / "axe-core" \
    / "axe.min.js"
SPEC = {"name": "ship", "params": [{"name": "version", "type": "string"},
                                   {"name": "canary", "type": "boolean"}], "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa", "timeout_seconds": 7200, "form": [
         {"name": "rollout", "type": "choice", "options": ["canary", "full"]}]}},
]}


# Rules held whatever their impact: a page's outline and what assistive technology names.
ALWAYS = ["heading-order", "empty-table-header", "landmark-unique", "region"]


def violations(page) -> list[str]:
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    found = page.evaluate("""async (always) => {
        const result = await axe.run(document, {resultTypes: ["violations"]});
        return result.violations.filter(v => ["serious", "critical"].includes(v.impact)
                                             || always.includes(v.id))
            .map(v => v.id + ": " + v.help + " at " + v.nodes.slice(0, 3)
                 .map(n => n.target.join(" ")).join(", "));
    }""", ALWAYS)
    return found


ODD = ("( ", " :", " ,", " .")  # a name pieced together with a stray space


def odd_names(page) -> list[str]:
    """Names assistive technology computes for the page's controls and regions that read
    wrongly: a hidden part of a button's name joined with a stray space ("Approve : QA")."""
    tree = page.context.new_cdp_session(page).send("Accessibility.getFullAXTree")
    names = {(node.get("role", {}).get("value", ""), node.get("name", {}).get("value", ""))
             for node in tree["nodes"]}
    return sorted(f"{role} named {name!r}" for role, name in names
                  if any(odd in name for odd in ODD))


@pytest.mark.parametrize("width", [390, 1280])
def test_every_page_has_no_serious_accessibility_violation(browser, live_server, people,
                                                           width, settings):
    from django.contrib.auth.models import Permission

    assert AXE.exists(), "make test installs axe-core (tests/support/axe)"
    people["bob"].user_permissions.add(*Permission.objects.filter(
        codename__in=["export_audit", "operate_run", "add_run"]))
    from goals.models import Goal

    store_spec(SPEC)
    from workflows.delivery import links

    settings.DEBUG = True  # the development mail page too
    goal = Goal.objects.create(title="Ship 5", owner=people["alice"])
    Goal.objects.create(title="Ship 5 docs", parent=goal, owner=people["alice"])
    runs = []
    for title in ("Ship 5.0", "Ship 5.1"):
        run = engine.open_run("ship", actor=people["alice"], title=title, goal=goal,
                              params={"version": "5"}).run
        work(run, "build", summary="green")
        runs.append(run)
    from workflows.models import Notification

    # A mail with a link in it, as the development mail page shows it (a link in a dark block).
    Notification.objects.create(user=people["bob"], key="a11y", event="gate_waiting",
                                subject="Ship waits on qa", body=(
                                    f"Decide it at:\n{live_server.url}/decide/x/\n"))
    context = browser.new_context(base_url=live_server.url,
                                  viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        page.goto("/login/")
        problems = {"/login/": violations(page)}
        login(page, "bob")
        for url in ["/", f"/runs/{runs[0].pk}/", "/runs/", "/goals/", f"/goals/{goal.pk}/",
                    "/goals/progress/", f"/goals/{goal.pk}/progress/",
                    "/specs/", "/specs/ship/start/", "/decisions/", "/profile/",
                    "/gates/due/", "/audit/", "/workers/", f"/runs/{runs[0].pk}/cancel/",
                    "/specs/ship/", "/dev/mail/", "/decide/" + links.decision_token(
                        people["bob"], runs[1].steps.get(key="qa")) + "/"]:
            page.goto(url)
            problems[url] = violations(page) + odd_names(page)
        assert {url: found for url, found in problems.items() if found} == {}
    finally:
        context.close()


def test_the_admin_forms_name_every_control(browser, live_server, django_user_model):
    """The admin's own pages, autocomplete fields included (select2 draws a combobox with
    no name of its own)."""
    from goals.models import Goal

    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root")
    store_spec(SPEC)
    goal = Goal.objects.create(title="Ship 5", owner=root)
    Goal.objects.create(title="Ship 5 docs", parent=goal, owner=root)
    run = engine.open_run("ship", actor=root, title="Ship 5.0", goal=goal,
                          params={"version": "5"}).run
    work(run, "build", summary="green")
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280,
                                                                      "height": 800})
    page = context.new_page()
    try:
        login(page, "root")
        problems = {}
        for url in ["/admin/", "/admin/workflows/schedule/add/",
                    "/admin/workflows/specowner/add/", "/admin/goals/goal/add/",
                    f"/admin/goals/goal/{goal.pk}/change/",
                    f"/admin/workflows/run/{run.pk}/change/",
                    f"/admin/auth/user/{root.pk}/change/"]:
            page.goto(url)
            page.wait_for_load_state("load")
            problems[url] = violations(page)
        found = {url: found for url, found in problems.items() if found}
        assert not found, "\n".join(f"{url}: {v}" for url, vs in found.items() for v in vs)
        page.goto("/admin/goals/goal/add/")
        page.wait_for_load_state("load")
        name = page.evaluate("""() => {
            const box = document.querySelector(".select2-selection[role=combobox]");
            return box.getAttribute("aria-labelledby").split(" ")
                .map(id => document.getElementById(id).textContent.trim()).join(" ");
        }""")
        assert name.startswith("Parent:") or name.startswith("Owner:"), name
    finally:
        context.close()

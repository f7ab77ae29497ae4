"""In a real browser: an approver fills in a gate's form (a bad value is refused beside its
field), the branch they chose runs; a decision link from a mail opens the gate after sign-in."""

from __future__ import annotations

import pytest

from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import links
from workflows.models import Approval, Run
from workflows.specs.storage import store_spec

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROLLOUT = {"name": "rollout", "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "description": "Check the canary dashboard before choosing.",
     "approval": {"group": "qa", "form": [
         {"name": "rollout", "type": "choice", "options": ["canary", "full"], "required": True,
          "label": "Roll out as"},
         {"name": "percent", "type": "number", "default": 10, "label": "Canary percent"}]}},
    {"key": "canary", "title": "Canary", "depends_on": ["qa"],
     "when": {"state": "qa.rollout", "equals": "canary"}, "run": {"command": ["true"]}},
    {"key": "full", "title": "Full rollout", "depends_on": ["qa"],
     "when": {"state": "qa.rollout", "equals": "full"}, "run": {"command": ["true"]}},
]}


@pytest.fixture
def waiting(people):
    store_spec(ROLLOUT)
    run = engine.open_run("rollout", actor=people["alice"], title="Rollout 3.1").run
    work(run, "build", summary="ok")
    return run


def test_the_approver_fills_in_the_form_and_the_chosen_branch_runs(page, shoot, waiting):
    login(page, "bob")
    page.goto("/")
    card = f"#gate-{waiting.steps.get(key='qa').pk}"
    page.wait_for_selector(f"{card} >> text=Roll out as")
    page.select_option(f"{card} select[name=field_rollout]", "canary")
    # Past the browser's own check (a number box), the server refuses and says why beside
    # the field.
    page.evaluate(f"document.querySelector('{card} input[name=field_percent]')"
                  ".setAttribute('type', 'text')")
    page.fill(f"{card} input[name=field_percent]", "lots")
    page.click(f"{card} button:has-text('Approve')")
    page.wait_for_selector(f"{card} .errorlist >> text=must be a number")
    assert not Approval.objects.exists()
    shoot("gate-form-refused")
    page.fill(f"{card} input[name=field_percent]", "5")
    page.click(f"{card} button:has-text('Approve')")
    page.wait_for_selector(".decided >> text=You approved QA sign-off")
    assert Approval.objects.get().values == {"rollout": "canary", "percent": 5}
    page.goto(f"/runs/{waiting.pk}/")
    page.wait_for_selector("#step-full .status >> text=skipped")
    decision = page.inner_text("#step-qa .decision")
    assert "bob approved" in decision and "rollout" in decision and "canary" in decision
    assert "the condition wants 'full'" in page.inner_text(".timeline")
    assert Run.objects.get(pk=waiting.pk).shared_state["qa"]["rollout"] == "canary"
    shoot("gate-form-branch")


def test_a_decision_link_opens_the_gate_after_sign_in(page, shoot, waiting, people):
    gate = waiting.steps.get(key="qa")
    link = links.decision_url(people["carol"], gate).removeprefix("http://testserver")
    page.goto(link)
    page.wait_for_url("**/login/**")
    page.fill("input[name=username]", "carol")
    page.fill("input[name=password]", "pw-carol")
    page.click("button:has-text('Sign in')")
    page.wait_for_selector(f"#gate-{gate.pk} >> text=Check the canary dashboard")
    assert "Opening this page decides nothing" in page.inner_text("main")
    assert not Approval.objects.exists()
    shoot("decision-link")
    page.select_option(f"#gate-{gate.pk} select[name=field_rollout]", "full")
    page.click(f"#gate-{gate.pk} button:has-text('Approve')")
    page.wait_for_selector(".decided >> text=You approved QA sign-off")
    page.goto(link)
    page.wait_for_selector("[role=alert] >> text=no longer works")


def test_the_mailed_link_in_development_opens_the_gate_on_the_port_served(
        page, people, settings, live_server):
    """As `make run PORT=…` sets it up: links on the served address, mail printed readably,
    the link whole on its line; following it reaches the gate."""
    import io
    import re

    from django.core import mail

    from workflows.delivery import outbox
    from workflows.delivery.mail import ReadableConsoleBackend
    from workflows.models import OutboxMessage

    settings.TOLLGATE_BASE_URL = live_server.url
    settings.TOLLGATE_NOTIFY = True
    store_spec(ROLLOUT)
    run = engine.open_run("rollout", actor=people["alice"], title="Rollout 3.2").run
    work(run, "build", summary="ok")
    for pk in OutboxMessage.objects.filter(done_at__isnull=True).values_list("pk", flat=True):
        outbox.deliver(pk)
    found = [m for m in mail.outbox if "carol@example.com" in m.to]
    assert found, (list(OutboxMessage.objects.values("job", "events", "done_at", "last_error")),
                   [m.to for m in mail.outbox])
    [message] = found
    printed = io.StringIO()
    ReadableConsoleBackend(stream=printed).send_messages([message])
    [link] = re.findall(rf"^{re.escape(live_server.url)}/decide/\S+$", printed.getvalue(),
                        re.MULTILINE)
    page.goto(link)
    page.fill("input[name=username]", "carol")
    page.fill("input[name=password]", "pw-carol")
    page.click("button:has-text('Sign in')")
    gate = run.steps.get(key="qa")
    page.wait_for_selector(f"#gate-{gate.pk} >> text=Check the canary dashboard")

"""An approver's day in a real browser: inbox, approve, watch the run move on; reject needs why."""

from __future__ import annotations

import pytest

from goals.models import Goal
from tests.workflows.helpers import work
from workflows import engine
from workflows.models import Approval, Run
from workflows.specs.storage import store_spec

from .conftest import SCREENSHOTS, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHIP = {"name": "ship", "description": "Build, sign off, deploy", "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa", "required": 1}},
    {"key": "deploy", "title": "Deploy", "depends_on": ["qa"],
     "run": {"shell": "echo 'deployed <script>alert(1)</script>'"}},
]}


@pytest.fixture
def waiting_run(people):
    store_spec(SHIP)
    goal = Goal.objects.create(title="Ship 2.0", owner=people["alice"])
    Goal.objects.create(title="Docs", parent=goal)
    run = engine.open_run("ship", actor=people["alice"], goal=goal, title="Ship 2.0").run
    work(run, "build",
                             summary="green")
    return run


def test_approver_approves_from_inbox_and_sees_the_run_move_on(page, shoot, waiting_run,
                                                               consumers):
    consumers(workers=1)
    login(page, "bob")
    page.goto("/")
    page.wait_for_selector(f"#gate-{waiting_run.steps.get(key='qa').pk}")
    assert page.inner_text("#inbox-count") == "1"
    shoot("inbox")
    page.evaluate("window.__noReload = true")
    page.fill("textarea[aria-label^='Approval comment']", "Ship it")
    page.click("button:has-text('Approve')")
    page.wait_for_selector(".decided >> text=You approved QA sign-off")
    assert page.text_content("#inbox-count") == "0"
    assert page.evaluate("window.__noReload") is True  # swapped in place, no reload
    assert Approval.objects.get().comment == "Ship it"

    page.click(f"a[href='/runs/{waiting_run.pk}/']")
    page.evaluate("window.__noReload = true")
    # The consumer runs deploy; the page polls and shows it without a reload.
    page.wait_for_selector("#run-poll[data-status=completed]", state="attached")
    assert page.evaluate("window.__noReload") is True
    assert "deployed <script>" in page.text_content("pre.stdout")  # escaped, shown as text
    assert page.evaluate("document.querySelectorAll('#run-body script').length") == 0
    assert Run.objects.get(pk=waiting_run.pk).status == "completed"
    shoot("run")


def test_reject_without_comment_is_refused_in_the_page(page, shoot, waiting_run):
    login(page, "carol")
    page.goto(f"/runs/{waiting_run.pk}/")
    page.click("#step-qa button:has-text('Reject')")
    assert page.evaluate(
        "document.querySelector(\"#step-qa textarea[aria-label^='Why reject']\")"
        ".matches(':invalid')")
    # Past the browser's own check, the server refuses too and says why, in the page.
    page.evaluate("document.querySelectorAll('#step-qa [required]')"
                  ".forEach(e => e.removeAttribute('required'))")
    page.click("#step-qa button:has-text('Reject')")
    page.wait_for_selector("[role=alert] >> text=A comment is required to reject.")
    assert not Approval.objects.exists()
    assert waiting_run.steps.get(key="qa").status == "waiting_approval"
    shoot("run-reject-refused")


def test_every_page_renders_and_is_captured(page, shoot, waiting_run):
    page.goto("/login/")
    shoot("login")
    login(page, "alice")
    for name, url in [("goals", "/goals/"), ("runs", "/runs/"),
                      ("goal", f"/goals/{waiting_run.goal_id}/"),
                      ("run-operator", f"/runs/{waiting_run.pk}/"),
                      ("cancel-confirm", f"/runs/{waiting_run.pk}/cancel/"),
                      ("progress", "/goals/progress/"), ("tokens", "/profile/")]:
        page.goto(url)
        shoot(name)
    page.goto("/goals/")
    page.click(f"#goal-{waiting_run.goal_id} button.toggle")
    page.wait_for_selector("text=Docs")
    shoot("goals-expanded")
    page.goto(f"/runs/{waiting_run.pk}/")
    page.click("text=Cancel run…")  # the page that asks why
    page.fill("textarea[name=reason]", "superseded by 2.1")
    page.click("button:has-text('Yes, cancel the run')")
    page.wait_for_selector("#run-poll[data-status=cancelled]", state="attached")
    assert "superseded by 2.1" in page.inner_text(".timeline")
    assert Run.objects.get(pk=waiting_run.pk).status == "cancelled"


def test_a_refusal_stays_in_the_page_with_debug_on(page, settings, waiting_run):
    settings.DEBUG = True  # as under `make run`
    login(page, "carol")
    page.goto(f"/runs/{waiting_run.pk}/")
    page.evaluate("document.querySelectorAll('#step-qa [required]')"
                  ".forEach(e => e.removeAttribute('required'))")
    page.click("#step-qa button:has-text('Reject')")
    page.wait_for_selector("[role=alert] >> text=A comment is required to reject.")
    assert page.locator("header.bar").count() == 1  # the page is still there around it
    assert page.locator("link[rel=stylesheet]").count() == 1


def test_the_inbox_card_carries_the_evidence_and_approves_in_one_click(page, shoot,
                                                                       waiting_run):
    login(page, "bob")
    card = f"#gate-{waiting_run.steps.get(key='qa').pk}"
    page.wait_for_selector(f"{card} .evidence >> text=Build")
    assert "green" in page.inner_text(f"{card} .evidence")
    assert "0 of 1" in page.inner_text(f"{card} .quorum")
    shoot("inbox-evidence")
    page.click(f"{card} button:has-text('Approve')")  # the one click: evidence is on screen
    page.wait_for_selector(".decided >> text=You approved QA sign-off")
    assert Approval.objects.get().user.username == "bob"


# Words of a line of text that a layout split over two lines ("ATTE MPT"): real words only
# (up to 24 letters), outside code and preformatted output, where long tokens may wrap.
BROKEN_WORDS = """
() => {
  const broken = [];
  const main = document.querySelector("main");
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const parent = node.parentElement;
    if (!parent || parent.closest("pre, code, svg, .visually-hidden")
        || !parent.offsetParent) continue;
    const re = /[A-Za-z][A-Za-z'-]*/g;
    let match;
    while ((match = re.exec(node.data))) {
      if (match[0].length < 2 || match[0].length > 24) continue;
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
                                                      .map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(match[0]);
    }
  }
  return broken;
}
"""


@pytest.mark.parametrize("width", [390, 1280])
def test_no_page_overflows_its_width_or_breaks_a_word(browser, live_server, waiting_run,
                                                      people, width):
    """At phone width and desktop width, no page scrolls sideways, every button is on screen,
    and no word is broken inside; tables turn into labelled rows on a phone."""
    from django.contrib.auth.models import Permission

    people["bob"].user_permissions.add(Permission.objects.get(codename="export_audit"))
    # Long words and a long unbroken token squeeze tables: words must stay whole anyway.
    engine.open_run("ship", actor=people["alice"], goal=waiting_run.goal,
                    title="Attempt reconciliation of " + "x" * 90 + " before Revoke",
                    idempotency_key="k" * 120)
    context = browser.new_context(base_url=live_server.url,
                                  viewport={"width": width, "height": 800})
    page = context.new_page()
    goal = waiting_run.goal
    try:
        login(page, "bob")
        for url in ["/", f"/runs/{waiting_run.pk}/", "/runs/", "/goals/",
                    f"/goals/{goal.pk}/", "/goals/progress/", f"/goals/{goal.pk}/progress/",
                    "/specs/", "/specs/ship/start/", "/decisions/", "/profile/",
                    "/gates/due/", "/audit/"]:
            page.goto(url)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= page.evaluate("window.innerWidth"), (url, width, wide)
            for button in page.query_selector_all("button"):
                box = button.bounding_box()
                if box:  # a button in a closed <details> has none
                    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, (url, width)
            assert page.evaluate(BROKEN_WORDS) == [], (url, width)
        if width < 640:
            page.goto("/runs/")
            label = page.evaluate("getComputedStyle(document.querySelector("
                                  "'table.stack td[data-label]'), '::before').content")
            assert label == '"Run"'
        page.goto(f"/runs/{waiting_run.pk}/")
        page.screenshot(path=str(SCREENSHOTS / f"run-{width}px.png"), full_page=True)
        page.goto("/goals/progress/")
        page.screenshot(path=str(SCREENSHOTS / f"progress-{width}px.png"), full_page=True)
    finally:
        context.close()


def test_the_inbox_is_live(page, waiting_run, people):
    """A gate decided elsewhere turns into its decided state on an open inbox, no reload."""
    spec_gate = waiting_run.steps.get(key="qa")
    login(page, "carol")
    page.evaluate("window.__noReload = true")
    page.wait_for_selector(f"#gate-{spec_gate.pk} button:has-text('Approve')")
    engine.cancel_run(waiting_run, actor="test")  # the gate is gone elsewhere
    page.wait_for_selector(f"#gate-{spec_gate.pk}.decided >> text=No longer waits on you")
    assert page.query_selector(f"#gate-{spec_gate.pk} button") is None
    assert page.text_content("#inbox-count") == "0"
    assert page.evaluate("window.__noReload") is True


def test_an_open_inbox_polls_its_versions_and_reads_the_database_only_on_a_change(
        page, waiting_run, people):
    """The poller sends the versions each answer gives: polls between changes are answered
    from them alone (no Tollgate-Seen header: the database was not read), and a change
    (here, bob's approval of the gate carol could decide) shows within the next polls."""
    gate = waiting_run.steps.get(key="qa")
    login(page, "carol")
    answers = []
    page.on("response", lambda r: answers.append((r.status, r.headers.get("tollgate-seen")))
            if "poll=1" in r.url else None)
    page.wait_for_selector(f"#gate-{gate.pk} button:has-text('Approve')")
    first = page.input_value("#inbox-poll input[name=seen]")
    page.wait_for_function("n => window.performance.getEntriesByType('resource')"
                           ".filter(e => e.name.includes('poll=1')).length >= n", arg=3)
    assert answers and all(status == 204 and seen is None for status, seen in answers)
    engine.approve(waiting_run, "qa", user=people["bob"])
    page.wait_for_selector(f"#gate-{gate.pk}.decided >> text=No longer waits on you")
    # The answer that brought the change gave new versions, and the poller sends them.
    page.wait_for_function(f"() => document.querySelector('#inbox-poll input[name=seen]')"
                           f".value !== {first!r}")


def test_what_a_person_types_survives_a_live_update(page, shoot, waiting_run, people):
    """A new gate arrives and another approver decides while carol types her comment and
    ticks a box: the new card is added, the quorum line changes, her words stay."""
    gate = waiting_run.steps.get(key="qa")
    store_spec({**SHIP, "name": "ship2", "steps": [
        SHIP["steps"][0], {**SHIP["steps"][1], "approval": {"group": "qa", "required": 2}}]})
    two = engine.open_run("ship2", actor=people["alice"], title="Ship 2.2").run
    work(two, "build")
    slow = two.steps.get(key="qa")
    login(page, "carol")
    page.evaluate("window.__noReload = true")
    page.fill(f"#gate-{slow.pk} textarea[aria-label^='Approval comment']", "checked the diff")
    page.check(f"#gate-{gate.pk} input[name=gate]")
    third = engine.open_run("ship", actor=people["alice"], title="Ship 2.3").run
    work(third, "build")
    engine.approve(two, "qa", user=people["bob"])  # 1 of 2, decided elsewhere
    arrived = third.steps.get(key="qa").pk
    page.wait_for_selector(f"#gate-{arrived}")
    page.wait_for_selector(f"#quorum-{slow.pk} >> text=bob approved")
    assert page.input_value(
        f"#gate-{slow.pk} textarea[aria-label^='Approval comment']") == "checked the diff"
    assert page.is_checked(f"#gate-{gate.pk} input[name=gate]")
    assert page.text_content("#inbox-count") == "3"
    assert page.evaluate("window.__noReload") is True
    shoot("inbox-live-typing")
    page.click(f"#gate-{slow.pk} button:has-text('Approve')")
    page.wait_for_selector(f"#gate-{slow.pk}.decided")
    assert Approval.objects.get(user=people["carol"]).comment == "checked the diff"


def test_a_bulk_refusal_shows_in_its_card(page, waiting_run, people):
    second = engine.open_run("ship", actor=people["alice"], title="Ship 2.1").run
    work(second, "build")
    login(page, "bob")
    gates = [run.steps.get(key="qa").pk for run in (waiting_run, second)]
    for pk in gates:
        page.check(f"#gate-{pk} input[name=gate]")
    engine.cancel_run(second, actor="test")  # gone before bob presses
    page.fill("textarea[aria-label='Comment for the selected gates']", "green")
    page.click("button:has-text('Approve selected')")
    page.wait_for_selector(f"#gate-{gates[1]} .notice.error >> text=Not decided")
    assert "You approved QA sign-off" in page.text_content(".notice.ok")
    assert "Not decided" not in page.text_content(".notice.ok")
    assert page.query_selector("#bulk") is None  # nothing left to select


def test_bulk_approve_from_the_inbox(page, shoot, waiting_run, people):
    second = engine.open_run("ship", actor=people["alice"], title="Ship 2.1").run
    work(second, "build")
    login(page, "bob")
    for run in (waiting_run, second):
        page.check(f"#gate-{run.steps.get(key='qa').pk} input[name=gate]")
    page.fill("textarea[aria-label='Comment for the selected gates']", "both green")
    shoot("inbox-bulk")
    page.click("button:has-text('Approve selected')")
    page.wait_for_selector("text=Nothing waits on you.")
    assert Approval.objects.filter(comment="both green").count() == 2
    assert page.text_content("#inbox-count") == "0"


def test_the_card_holds_the_decision_with_deadline_words(page, shoot, people):
    """Params, the values upstream steps wrote, what approving and rejecting do, and the
    deadline in the viewer's zone with its consequence, counting down."""
    from workflows.models import Preference

    store_spec({"name": "deploy", "description": "Deploy a release",
                "params": [{"name": "version", "type": "string"},
                           {"name": "rollout", "type": "choice",
                            "options": ["full", "canary"]}],
                "steps": [
                    {"key": "build", "title": "Build", "run": {"command": ["true"]},
                     "compensation": {"command": ["true"]}},
                    {"key": "review", "title": "Code review", "depends_on": ["build"]},
                    {"key": "qa", "title": "QA sign-off", "depends_on": ["review"],
                     "description": "Check **{{ params.version }}** on staging first.",
                     "approval": {"group": "qa", "timeout_seconds": 3 * 3600 + 120}},
                    {"key": "ship", "title": "Deploy", "depends_on": ["qa"],
                     "run": {"command": ["true"]}}]})
    Preference.objects.create(user=people["bob"], time_zone="Europe/Paris")
    run = engine.open_run("deploy", actor=people["alice"], title="Release 2.2.0",
                          params={"version": "2.2.0", "rollout": "full"}).run
    work(run, "build", summary="built in 41 s")
    engine.record_transition(run, "review", actor=people["alice"], step_status="completed",
                             state_patch={"verdict": "ok", "score": 0.97})
    login(page, "bob")
    card = f"#gate-{run.steps.get(key='qa').pk}"
    text = page.inner_text(card)
    assert "2.2.0" in text and "verdict" in text and "0.97" in text
    assert "Approving starts: Deploy" in text
    assert "Rejecting fails the run and runs the compensations of Build" in text
    assert "rejects itself in 3 h" in text and ("CET" in text or "CEST" in text)
    assert page.inner_text(f"{card} .instructions strong") == "2.2.0"
    shoot("inbox-card")


def test_a_signed_gate_is_approved_with_the_password_re_entered(page, shoot, people):
    """The card asks for the password; a wrong one decides nothing and says so in the page;
    the right one approves, and the run page shows who signed, when and what it means."""
    spec = store_spec({"name": "signed", "steps": [
        {"key": "qa", "title": "Release sign-off", "approval": {
            "group": "qa", "signature": {"meaning": "Approved for release"}}}]})[0]
    people["bob"].first_name, people["bob"].last_name = "Bob", "Builder"
    people["bob"].save()
    run = engine.open_run(spec, actor=people["alice"], title="Release 4.0").run
    login(page, "bob")
    page.goto("/")
    field = page.get_by_label("Your password, to sign this approval as Bob Builder")
    field.fill("not-my-password")
    page.click("button:has-text('Approve')")
    page.wait_for_selector("[role=alert] >> text=That is not your password")
    assert not Approval.objects.exists()
    shoot("signature-refused")
    page.get_by_label("Your password, to sign this approval as Bob Builder").fill("pw-bob")
    page.click("button:has-text('Approve')")
    page.wait_for_selector(".decided >> text=You approved Release sign-off")
    approval = Approval.objects.get()
    assert (approval.signature_meaning, approval.signer_name) == ("Approved for release",
                                                                  "Bob Builder")
    page.goto(f"/runs/{run.pk}/")
    signed = page.inner_text("#step-qa .signed")
    assert signed.startswith("signed “Approved for release” as Bob Builder (bob) at ")
    shoot("signature-shown")


def test_a_signed_gate_is_approved_with_a_passkey(page, shoot, people):
    """Chromium with a virtual authenticator (WebAuthn through the DevTools protocol): bob
    adds a passkey on his profile, then signs the gate with it; the record says so, and the
    authenticator's counter moved."""
    from workflows.models import Passkey

    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
        "hasUserVerification": True, "isUserVerified": True}})
    spec = store_spec({"name": "signed", "steps": [
        {"key": "qa", "title": "Release sign-off", "approval": {
            "group": "qa", "signature": {"meaning": "Approved for release"}}}]})[0]
    run = engine.open_run(spec, actor=people["alice"], title="Release 4.0").run
    login(page, "bob")
    page.goto("/profile/")
    page.get_by_label("Passkey name").fill("virtual key")
    page.click("button:has-text('Add a passkey')")
    page.wait_for_selector("text=Passkey “virtual key” added")
    passkey = Passkey.objects.get(user=people["bob"])
    shoot("passkey-added")

    page.goto("/")
    page.get_by_label("Approval comment for Release sign-off").fill("checked the notes")
    page.click("button:has-text('or sign with a passkey')")
    page.wait_for_selector(".decided >> text=You approved Release sign-off")
    approval = Approval.objects.get()
    assert (approval.signature_meaning, approval.signature_method, approval.comment) == (
        "Approved for release", "passkey", "checked the notes")
    passkey.refresh_from_db()
    assert passkey.sign_count > 0 and passkey.last_used_at is not None
    page.goto(f"/runs/{run.pk}/")
    assert "by passkey" in page.inner_text("#step-qa .signed")
    shoot("passkey-signed")

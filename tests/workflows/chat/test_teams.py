"""Teams beyond the contract both platforms keep: the Bot Framework token checked before
anything is read (signature, issuer, audience, expiry, service URL, tenant); each person's
view of a card (only people who may decide see Approve and Reject, and the card refreshes by
itself for them); accounts matched by the Entra object id sign-on gave; values that stay text;
reminders in the card's thread."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.workflows.helpers import work
from workflows import engine
from workflows.chat import messages
from workflows.chat import teams as teams_chat
from workflows.models import (
    Approval,
    ChatIdentity,
    ChatInteraction,
    ChatMessage,
    SsoIdentity,
    Step,
)
from workflows.specs.storage import store_spec
from workflows.sso.accounts import sign_in_user
from workflows.timing import clock, deadlines

from . import fake_teams
from .fake_teams import TENANT, object_id
from .platforms import TeamsDriver

pytestmark = pytest.mark.django_db(transaction=True)

QA = "19:qa@thread.tacv2"
GATE = {"name": "ship", "params": [{"name": "note", "type": "string"}], "steps": [
    {"key": "build", "title": "Build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "description": "Read the [notes](https://notes.example/{{ params.note }}) for "
                    "{{ params.note }}.",
     "approval": {"group": "qa", "timeout_seconds": 3600}}]}


@pytest.fixture
def driver(teams):
    return TeamsDriver(teams, teams.url)


def waiting(people, note="1.2"):
    store_spec(GATE)
    run = engine.open_run("ship", actor=people["alice"], params={"note": note}).run
    work(run, "build")
    return run, run.steps.get(key="qa")


def signed_on(user, name):
    SsoIdentity.objects.create(user=user, issuer=f"https://login.microsoftonline.com/"
                               f"{TENANT}/v2.0", subject=f"pairwise-{name}",
                               object_id=object_id(name), tenant_id=TENANT)


def test_a_request_is_refused_unless_the_bot_framework_signed_it_for_this_app(teams, driver,
                                                                              people):
    run, gate = waiting(people)
    bob = teams.member("bob")
    press = teams.activity(gate, "tollgate.approve", bob)
    refused = {
        "no token": teams.send(teams.url, press, token=None),
        "another key": teams.send(teams.url, press, token=teams.token(
            key=fake_teams.new_key())),
        "expired": teams.send(teams.url, press, token=teams.token(expires_in=-600)),
        "another audience": teams.send(teams.url, press, token=teams.token(
            audience="another-app")),
        "another issuer": teams.send(teams.url, press, token=teams.token(
            issuer="https://evil.example")),
        "another service": teams.send(teams.url, press, token=teams.token(
            service_url="https://smba.evil.example/")),
        "another tenant": teams.send(teams.url, teams.activity(
            gate, "tollgate.approve", bob, tenant="another-tenant")),
        "not an activity": teams.send(teams.url, ["approve"]),
    }
    assert {why: status for why, (status, _) in refused.items()} == {
        why: 401 for why in refused}
    assert "tenant" in refused["another tenant"][1]["error"]
    assert not ChatInteraction.objects.exists() and not Approval.objects.exists()
    assert teams.send(teams.url, press)[0] == 200  # the same press, signed as it should be


def test_only_activities_from_teams_signed_by_a_key_endorsed_for_teams_are_taken(
        teams, driver, people):
    """Web Chat and Direct Line are Bot Framework channels too, driven by any web page that
    holds the bot's secret, which writes the tenant and the person's object id itself: their
    activities never decide, whichever key signed them."""
    run, gate = waiting(people)
    bob = teams.member("bob")
    web_token = teams.token(key=teams.web_key, kid=teams.web_kid)
    refused = {
        "webchat": teams.send(teams.url, teams.activity(gate, "tollgate.approve", bob,
                                                         channel_id="webchat"), web_token),
        "directline": teams.send(teams.url, teams.activity(
            gate, "tollgate.approve", bob, channel_id="directline"), web_token),
        "webchat with a Teams key": teams.send(teams.url, teams.activity(
            gate, "tollgate.approve", bob, channel_id="webchat")),
        "Teams with a Web Chat key": teams.send(teams.url, teams.activity(
            gate, "tollgate.approve", bob), web_token),
    }
    assert {why: status for why, (status, _) in refused.items()} == {
        why: 401 for why in refused}
    assert "Microsoft Teams" in refused["webchat"][1]["error"]
    assert "endorsed" in refused["Teams with a Web Chat key"][1]["error"]
    assert not ChatInteraction.objects.exists() and not Approval.objects.exists()


def test_a_card_refreshes_only_where_it_was_posted_and_for_those_who_may_read_it(
        teams, driver, people, settings):
    """A refresh names whatever step id it likes: another channel's gate, or a run the
    person may not read (TOLLGATE_RUN_VISIBILITY), shows nothing."""
    settings.TOLLGATE_RUN_VISIBILITY = "involved"
    driver.link(people["erin"])  # in no group of the run: not involved
    driver.link(people["bob"])
    run, gate = waiting(people)
    for name, channel in (("bob", "19:elsewhere@thread.tacv2"), ("erin", QA)):
        driver.account(name)
        status, answer = teams.send(teams.url, teams.activity(
            gate, "tollgate.refresh", teams.member(name), channel=channel))
        assert status == 200 and "QA sign-off" not in json.dumps(answer), (name, answer)
    assert "QA sign-off" in json.dumps(driver.view(gate, "bob"))


def test_only_people_who_may_decide_see_the_buttons(teams, driver, people):
    for name in ("bob", "carol", "erin", "alice"):
        driver.account(name)
    signed_on(people["bob"], "bob")  # matched by the object id sign-on gave
    driver.link(people["carol"])
    driver.link(people["erin"])  # not in qa
    driver.link(people["alice"])  # opened the run
    run, gate = waiting(people)
    [card] = teams.cards(QA)
    # Everyone's card: no decision buttons; it refreshes by itself for bob and carol.
    assert "tollgate.approve" not in json.dumps(card)
    assert sorted(card["refresh"]["userIds"]) == ["29:bob-teams-id", "29:carol-teams-id"]
    assert card["refresh"]["action"]["verb"] == "tollgate.refresh"

    bob_view = json.dumps(driver.view(gate, "bob")["value"])
    assert "tollgate.approve" in bob_view and "tollgate.reject" in bob_view
    assert '"id": "comment"' in bob_view
    for name, why in (("erin", "qa"), ("alice", "")):
        view = json.dumps(driver.view(gate, name)["value"])
        assert "tollgate.approve" not in view and "You cannot decide this" in view
        assert why in view
    assert ChatIdentity.objects.get(user=people["bob"]).matched_by == "object id"

    # Once bob decided, his own view no longer offers it, and the card says who.
    driver.press(gate, "approve", "bob")
    assert driver.handled() == ["approved by bob"]
    [card] = teams.cards(QA)
    assert "bob approved via Teams (Bob Smith)" in json.dumps(card)
    assert "refresh" not in card  # the gate ended: nothing left to refresh


def test_an_account_is_matched_by_its_entra_object_id_from_sign_on(teams, driver, people):
    claims = {"sub": "pairwise-bob", "oid": object_id("bob"), "tid": TENANT,
              "email": "bob@acme.test", "email_verified": True}
    issuer = f"https://login.microsoftonline.com/{TENANT}/v2.0"
    user = sign_in_user(claims, issuer)
    identity = SsoIdentity.objects.get(user=user)
    assert (identity.object_id, identity.tenant_id) == (object_id("bob"), TENANT)
    user.groups.add(people["bob"].groups.get())
    run, gate = waiting(people)
    driver.press(gate, "approve", "bob")
    assert driver.handled() == [f"approved by {user}"]
    decision = Approval.objects.get()
    assert decision.chat_identity == f"teams:{TENANT}/{object_id('bob')} Bob Smith"
    # Another tenant's account with the same object id is not this person.
    assert not SsoIdentity.objects.filter(object_id=object_id("bob"),
                                          tenant_id="another").exists()


def test_values_in_the_card_stay_text(teams, driver, people):
    waiting(people, note="[pay](https://evil.example) **now**")
    text = json.dumps(teams.cards(QA)[0])
    assert "[notes](https://notes.example/" in text  # the author's link
    assert "](https://evil" not in text and "\\\\[pay\\\\]" in text
    assert "\\\\*\\\\*now\\\\*\\\\*" in text


def test_a_reminder_is_said_in_the_cards_thread(teams, driver, people):
    run, gate = waiting(people)
    Step.objects.filter(pk=gate.pk).update(remind_at=clock.now() - timedelta(seconds=1))
    assert deadlines.remind() == 1
    [(thread, [reminder])] = teams.threads.items()
    assert thread == f"{QA};messageid={teams.channels[QA][0]['id']}"
    assert reminder == "Reminder: **QA sign-off** still waits on qa (0 of 1 approval)."


def test_without_its_tenant_teams_takes_nobodys_request_and_check_says_so(teams, driver,
                                                                         people, settings):
    from workflows.ops.checks import teams_tenant

    run, gate = waiting(people)
    assert teams_tenant(None) == []
    settings.TOLLGATE_TEAMS_TENANT_ID = ""
    assert [e.id for e in teams_tenant(None)] == ["tollgate.E006"]
    status, answer = teams.send(teams.url, teams.activity(gate, "tollgate.approve",
                                                          teams.member("bob")))
    assert status == 401 and "TOLLGATE_TEAMS_TENANT_ID" in answer["error"]
    assert not ChatInteraction.objects.exists()


def test_a_person_is_matched_by_a_verified_email_or_links_their_account(teams, driver,
                                                                        people):
    from django.test import Client

    run, gate = waiting(people)
    # carol's Teams e-mail is not one sign-on verified: her own view gives her the link,
    # whose page shows the tenant, object id and name, and she confirms it.
    people["carol"].email = "carol@acme.test"
    people["carol"].save()
    driver.account("carol", email="carol@acme.test")
    card = driver.view(gate, "carol")["value"]
    [link] = [a["url"] for a in card["actions"] if a["title"] == "Link your account"]
    carol = Client()
    carol.force_login(people["carol"])
    path = f"/chat/link/{link.split('/chat/link/')[1]}"
    page = carol.get(path).content.decode()
    for shown in ("Teams", "Tenant", TENANT, object_id("carol"), "Carol Smith",
                  "carol@acme.test"):
        assert shown in page, shown
    assert carol.post(path).status_code == 200
    assert "tollgate.approve" in json.dumps(driver.view(gate, "carol")["value"])

    # bob's is the e-mail his sign-on verified: matched at his first press.
    SsoIdentity.objects.create(user=people["bob"], issuer="https://id.acme.test",
                               subject="bob", email="bob@acme.test", email_verified=True)
    driver.account("bob", email="BOB@acme.test")
    driver.press(gate, "approve", "bob")
    assert driver.handled() == ["approved by bob"]
    assert ChatIdentity.objects.get(user=people["bob"]).matched_by == "email"


def test_a_person_a_gate_is_reassigned_to_is_told_directly(teams, driver, people):
    run, gate = waiting(people)
    driver.link(people["dave"])
    engine.reassign_gate(run, "qa", actor=people["alice"], reason="qa is away",
                         person="dave")
    [note] = driver.told("dave")
    assert note.startswith("QA sign-off waits on you.") and f"/runs/{run.pk}/" in note
    assert "tollgate.approve" in json.dumps(driver.view(gate, "dave")["value"])


@pytest.mark.parametrize("how", ["hang", "cut"])
def test_a_card_whose_answer_was_lost_is_posted_once_and_its_outcome_said_after(
        teams, driver, people, settings, how):
    """The Bot Connector takes the post but its answer never comes: Teams cannot look the
    card up, so it is not posted again; when every answer is lost, the decision's outcome is
    posted beside it, once."""
    settings.TOLLGATE_TEAMS_TIMEOUT_SECONDS = 0.5
    teams.lose_answers = how
    run, gate = waiting(people)
    assert len(teams.cards(QA)) == 1  # it went out
    row = ChatMessage.objects.get(step=gate, provider="teams")
    assert row.ref == "" and row.posted_at is not None
    messages.sync(teams_chat.provider(), run.pk, ["qa"])  # the outbox tries again
    assert len(teams.cards(QA)) == 1

    engine.approve(run, "qa", user=people["bob"])
    cards = teams.cards(QA)
    assert len(cards) == 2 and "bob approved" in json.dumps(cards[1])
    assert "refresh" not in cards[1]
    assert ChatMessage.objects.get(step=gate, provider="teams").final
    messages.sync(teams_chat.provider(), run.pk, [""])  # the run ended: said once only
    assert len(teams.cards(QA)) == 2


def test_a_press_on_a_card_whose_answer_was_lost_names_it_and_decisions_update_it(
        teams, driver, people, settings):
    settings.TOLLGATE_TEAMS_TIMEOUT_SECONDS = 0.5
    teams.lose_answers = "cut"
    run, gate = waiting(people)
    teams.lose_answers = None
    [posted] = teams.channels[QA]
    driver.link(people["bob"])
    assert "QA sign-off" in json.dumps(driver.view(gate, "bob"))  # its refresh names it
    assert ChatMessage.objects.get(step=gate, provider="teams").ref == posted["id"]
    driver.press(gate, "approve", "bob")
    assert driver.handled() == ["approved by bob"]
    [card] = teams.cards(QA)  # that card updated, nothing posted beside it
    assert "bob approved" in json.dumps(card)


def test_a_refused_form_keeps_the_number_typed_as_a_number(teams, driver, people):
    from .test_contract import ROLLOUT
    from .test_contract import waiting as waiting_on

    run, gate = waiting_on(people, spec=ROLLOUT)
    driver.link(people["bob"])
    status, answer = driver.press(gate, "approve", "bob", values={"percent": "25"})
    assert status == 200  # refused: the rollout is missing
    [number] = [i for i in _inputs(answer["value"])
                if i["id"] == "field_percent"]
    assert number["type"] == "Input.Number" and number["value"] == 25


def _inputs(card: dict) -> list[dict]:
    found = []

    def walk(node):
        if isinstance(node, dict):
            if str(node.get("type", "")).startswith("Input."):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card)
    return found

"""What deciding in chat means, on every platform (Slack and Teams, each against its fake on
127.0.0.1 over HTTP): a gate posted to its group's channel; decided in one press (two with a
form) through the engine, with the web's refusals; someone chat cannot match given the link
before any form; requests that are not the platform's, or come twice, refused with nothing
recorded; the platform away and back losing nothing; chat following the gate through its
stages; a delegate told for whom they decide; the channel and person of each decision kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from tests.conftest import make_user
from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import outbox
from workflows.models import (
    Approval,
    ChatIdentity,
    ChatInteraction,
    OutboxJob,
    OutboxMessage,
    Preference,
)
from workflows.specs.storage import store_spec
from workflows.timing import clock

pytestmark = pytest.mark.django_db(transaction=True)

PAYROLL = {"name": "payroll", "params": [{"name": "month", "type": "string", "label": "Month"}],
           "steps": [
               {"key": "compute", "title": "Compute", "run": {"command": ["true"]}},
               {"key": "sign", "title": "Finance sign-off", "depends_on": ["compute"],
                "description": "Compare **{{ params.month }}** with the ledger.",
                "approval": {"group": "qa", "required": 2, "timeout_seconds": 7200}}]}

ROLLOUT = {"name": "rollout", "steps": [
    {"key": "build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa", "form": [
         {"name": "rollout", "type": "choice", "options": ["canary", "full"],
          "required": True, "label": "Roll out as"},
         {"name": "percent", "type": "number", "default": 10},
         {"name": "notify", "type": "boolean"}]}}]}


def waiting(people, spec=PAYROLL, **params):
    store_spec(spec)
    run = engine.open_run(spec["name"], actor=people["alice"], title="November",
                          params=params or None).run
    work(run, spec["steps"][0]["key"], evidence={}, state_patch={"total": 1200})
    return run, run.steps.get(kind="approval")


def test_a_waiting_gate_is_posted_to_its_groups_channel(platform, people):
    run, gate = waiting(people, month="November")
    assert platform.posted_channels() == [platform.group_channels["qa"]]
    shown = platform.shown(platform.group_channels["qa"])
    for essential in ("Finance sign-off", "November", f"/runs/{run.pk}/", "total = 1200",
                      "0 of 2", "then it rejects itself"):
        assert essential in shown, essential


def test_an_approver_decides_in_one_press_and_every_message_follows(platform, people):
    run, gate = waiting(people, month="November")
    platform.link(people["bob"])
    status, _ = platform.press(gate, "approve", "bob")
    assert status == 200
    assert not Approval.objects.exists()  # acknowledged first, decided after
    assert platform.handled() == ["approved by bob"]
    decision = Approval.objects.get()
    assert (decision.user, decision.channel) == (people["bob"], "chat")
    assert decision.chat_identity.startswith(f"{platform.provider_name}:")
    assert decision.channel_label == platform.label("bob")
    channel = platform.group_channels["qa"]
    assert "1 of 2" in platform.shown(channel)
    assert f"bob approved via {platform.label('bob')}" in platform.shown(channel)

    # Carol decides on the web: the message shows the end, with no button left.
    carol = Client()
    carol.force_login(people["carol"])
    carol.post(f"/runs/{run.pk}/steps/sign/approve/", {"via": "run_page"})
    final = platform.shown(channel)
    assert "Approved by bob, carol" in final and not platform.has_buttons(final)
    audit = carol.get(f"/runs/{run.pk}/audit/").json()["decisions"]
    assert [(d["user"], d["channel"]) for d in audit] == [("bob", "chat"),
                                                         ("carol", "run_page")]


def test_with_both_platforms_each_keeps_and_updates_its_own_messages(slack, teams, people):
    """Slack and Teams on together: the gate is posted once on each, a decision updates
    each platform's own message (never the other's ids), and no outbox job fails."""
    from .platforms import SlackDriver, TeamsDriver

    run, gate = waiting(people, month="November")
    on_slack, on_teams = SlackDriver(slack, slack.url), TeamsDriver(teams, teams.url)
    carol = Client()
    carol.force_login(people["carol"])
    carol.post(f"/runs/{run.pk}/steps/sign/approve/", {"via": "run_page"})
    for driver in (on_slack, on_teams):
        assert driver.posted_channels() == [driver.group_channels["qa"]]
        assert "carol approved" in driver.shown(driver.group_channels["qa"])
    failed = OutboxMessage.objects.filter(job=OutboxJob.CHAT).exclude(last_error="")
    assert not failed.exists(), list(failed.values_list("last_error", flat=True))


def test_chat_refuses_what_the_web_refuses(platform, people):
    run, gate = waiting(people, month="May")
    platform.link(people["erin"])  # not in qa
    platform.press(gate, "approve", "erin")
    assert platform.handled()[0].startswith("refused:")
    assert "qa" in platform.told("erin")[-1]
    people["alice"].groups.add(people["bob"].groups.get())
    platform.link(people["alice"])  # in qa now, but she opened the run: four eyes
    platform.press(gate, "approve", "alice")
    assert platform.handled()[0].startswith("refused:")
    platform.link(people["bob"])
    platform.press(gate, "approve", "bob")
    platform.press(gate, "approve", "bob")  # again: counts once, and says why
    approved, again = platform.handled()
    assert approved == "approved by bob" and again.startswith("refused: bob has already")
    assert "already decided" in platform.told("bob")[-1]
    assert list(Approval.objects.values_list("user__username", flat=True)) == ["bob"]


def test_someone_chat_cannot_match_gets_the_link_before_any_form(platform, people):
    run, gate = waiting(people, spec=ROLLOUT)
    if platform.name == "teams":
        # Their own view of the card says so, with the link, and shows no field.
        card = platform.view(gate, "erin")["value"]
        texts = str(card)
        assert "Link your account" in texts and "/chat/link/" in texts
        assert "Input." not in texts
    status, answer = platform.press(gate, "approve", "erin")
    assert platform.forms_opened() == 0
    assert "is required" not in str(answer)  # not asked to fill in a form for nothing
    platform.handled()
    assert "/chat/link/" in platform.told("erin")[-1]
    assert list(ChatInteraction.objects.values_list("outcome", flat=True))[-1] == "not linked"
    assert not Approval.objects.exists()


def test_a_form_is_filled_in_chat_and_its_errors_shown(platform, people):
    run, gate = waiting(people, spec=ROLLOUT)
    platform.link(people["bob"])
    status, answer = platform.press(gate, "approve", "bob", values={"percent": "ten"},
                                    form=True)
    assert status == 200 and "rollout" in str(answer) and "percent" in str(answer)
    assert platform.handled() == [] and not Approval.objects.exists()
    platform.press(gate, "approve", "bob", form=True, comment="dashboards fine",
                   values={"rollout": "canary", "percent": "25", "notify": True})
    assert platform.handled() == ["approved by bob"]
    run.refresh_from_db()
    assert run.shared_state["qa"] == {"rollout": "canary", "percent": 25, "notify": True}
    assert Approval.objects.get().comment == "dashboards fine"


def test_a_reject_needs_its_comment(platform, people):
    run, gate = waiting(people, month="May")
    platform.link(people["carol"])
    status, answer = platform.press(gate, "reject", "carol")
    assert "A comment is required to reject." in str(answer)
    assert platform.handled() == []
    platform.press(gate, "reject", "carol", comment="wrong month")
    assert platform.handled() == ["rejected by carol"]
    run.refresh_from_db()
    assert run.status == "failed"
    assert "Ended: wrong month" in platform.shown(platform.group_channels["qa"])


def test_a_signed_gate_sends_the_person_to_its_page(platform, people):
    spec = {"name": "signed", "steps": [
        {"key": "build", "run": {"command": ["true"]}},
        {"key": "qa", "title": "QA sign-off", "depends_on": ["build"], "approval": {
            "group": "qa", "signature": {"meaning": "I approve this release"}}}]}
    run, gate = waiting(people, spec=spec)
    platform.link(people["bob"])
    # The channel's message says it is signed on its page, and how.
    shown = platform.shown(platform.group_channels["qa"])
    assert "must be signed" in shown and "signing with your password or a passkey" in shown
    if platform.name == "teams":
        card = str(platform.view(gate, "bob")["value"])
        assert "Sign in Tollgate" in card and "tollgate.approve" not in card
        assert "signing with your password or a passkey" in card
    platform.press(gate, "approve", "bob")
    assert platform.handled()[0].startswith("refused:")
    assert "must be signed" in platform.told("bob")[-1]
    assert not Approval.objects.exists()


def test_forged_and_replayed_requests_are_refused_and_record_nothing(platform, people):
    run, gate = waiting(people, month="May")
    platform.link(people["bob"])
    status, _ = platform.forge(gate, "bob")
    assert status == 401 and not ChatInteraction.objects.exists()
    assert platform.replay(gate, "bob") == [200, 401]
    assert ChatInteraction.objects.count() == 1
    assert platform.handled() == ["approved by bob"]
    assert Approval.objects.count() == 1


def test_the_platform_away_and_back_loses_nothing_and_posts_once(platform, people):
    platform.fake.stop()
    run, gate = waiting(people, month="May")
    message = OutboxMessage.objects.get(job=OutboxJob.CHAT, done_at__isnull=True)
    assert message.attempts == 1 and message.last_error
    platform.fake.start()
    assert outbox.deliver(message.pk, now=clock.now() + timedelta(hours=2)) == "done"
    assert outbox.deliver(message.pk, now=clock.now() + timedelta(hours=4)) == "not due"
    assert platform.posted_channels() == [platform.group_channels["qa"]]
    platform.link(people["bob"])
    platform.press(gate, "approve", "bob")
    assert platform.handled() == ["approved by bob"]


def test_chat_follows_the_stages_and_tells_a_delegate_whom_they_decide_for(platform,
                                                                           people):
    olga, oscar = make_user("olga", "ops"), make_user("oscar", "ops")
    Preference.objects.create(user=olga, away_from=clock.now() - timedelta(days=1),
                              away_until=clock.now() + timedelta(days=3),
                              delegate=people["dave"])
    platform.link(people["dave"])
    spec = {**PAYROLL, "name": "staged", "steps": [
        PAYROLL["steps"][0], {**PAYROLL["steps"][1], "approval": {"rules": [
            {"group": "qa", "label": "QA", "order": 0},
            {"group": "ops", "label": "Ops", "order": 1}]}}]}
    run, gate = waiting(people, spec=spec, month="May")
    assert platform.posted_channels() == [platform.group_channels["qa"]]
    assert platform.told("dave") == []  # olga's stage has not opened
    engine.approve(run, "sign", user=people["bob"])  # QA met: the ops stage opens
    assert platform.posted_channels() == [platform.group_channels["qa"],
                                          platform.group_channels["ops"]]
    [note] = platform.told("dave")
    assert "You decide Finance sign-off" in note and "for olga, who is away until" in note
    engine.approve(run, "sign", user=oscar)
    assert platform.told("dave") == [note]  # told once
    for channel in platform.group_channels.values():
        assert "Approved by bob (qa), oscar (ops)" in platform.shown(channel)
    assert ChatIdentity.objects.get(user=people["dave"]).provider == platform.provider_name


def test_a_person_removed_at_the_company_provider_decides_nothing_from_chat(platform, people,
                                                                            settings):
    """Their sessions end and their tokens stop at the provider's word (or its silence past
    TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS); their chat accounts stop with them."""
    from workflows.models import SsoIdentity

    settings.TOLLGATE_OIDC_ISSUER = "https://id.acme.test"
    run, gate = waiting(people, month="November")
    platform.link(people["bob"])
    SsoIdentity.objects.create(
        user=people["bob"], issuer=settings.TOLLGATE_OIDC_ISSUER, subject="bob-sub",
        last_sign_in=clock.now() - timedelta(
            seconds=settings.TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS + 60))
    platform.press(gate, "approve", "bob")
    assert platform.handled() == ["not linked"]
    assert not Approval.objects.exists()
    SsoIdentity.objects.filter(user=people["bob"]).update(last_sign_in=clock.now())
    platform.press(gate, "approve", "bob")
    assert platform.handled() == ["approved by bob"]

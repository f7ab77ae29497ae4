"""Slack approvals against a fake Slack on 127.0.0.1 that records the Web API calls and posts
signed interaction payloads to Tollgate over HTTP: a gate posted, approved by a matched user,
refused for unmatched or ineligible people, a form in a modal, forged and replayed requests
refused, the message updated after a decision on the web, Slack away and back with nothing
lost, and the channel of each decision in the audit."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.test import Client

from tests.workflows.helpers import work
from workflows import engine
from workflows.chat import interactions
from workflows.chat import slack as slack_chat
from workflows.delivery import outbox
from workflows.models import (
    Approval,
    ChatIdentity,
    ChatInteraction,
    ChatMessage,
    OutboxJob,
    OutboxMessage,
    SsoIdentity,
    Step,
)
from workflows.specs.storage import store_spec
from workflows.timing import clock

from .fake_slack import button, submission

pytestmark = pytest.mark.django_db(transaction=True)

PAYROLL = {"name": "payroll", "params": [{"name": "month", "type": "string", "label": "Month"}],
           "steps": [
               {"key": "compute", "title": "Compute", "run": {"command": ["true"]}},
               {"key": "sign", "title": "Finance sign-off", "depends_on": ["compute"],
                "description": "Compare **{{ params.month }}** with the [ledger]"
                               "(https://ledger.example/nov) <now>.",
                "approval": {"group": "qa", "required": 2, "timeout_seconds": 7200}},
               {"key": "pay", "title": "Pay", "depends_on": ["sign"],
                "run": {"command": ["true"]}}]}

ROLLOUT = {"name": "rollout", "steps": [
    {"key": "build", "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
     "approval": {"group": "qa", "form": [
         {"name": "rollout", "type": "choice", "options": ["canary", "full"],
          "required": True, "label": "Roll out as"},
         {"name": "percent", "type": "number", "default": 10},
         {"name": "notify", "type": "boolean"}]}}]}


def sso(user, email):
    SsoIdentity.objects.create(user=user, issuer="https://id.acme.test", subject=user.username,
                               email=email, email_verified=True)


def handle(slack):
    """What the worker does with each doorbell rung since the last call."""
    chat = slack_chat.provider()
    outcomes = [interactions.handle(chat, pk) for pk in slack.doorbells]
    slack.doorbells.clear()
    return outcomes


def gate_waiting(people, spec=PAYROLL, **params):
    store_spec(spec)
    run = engine.open_run(spec["name"], actor=people["alice"], title="November",
                          params=params or None).run
    work(run, spec["steps"][0]["key"], evidence={}, state_patch={"total": 1200})
    return run, run.steps.get(kind="approval")


def test_a_waiting_gate_is_posted_with_its_essentials(slack, people):
    run, gate = gate_waiting(people, month="November")
    [post] = slack.calls_of("chat.postMessage")
    assert post["channel"] == "C-QA"
    text = json.dumps(post["blocks"])
    assert "Finance sign-off" in text and "November" in text
    assert f"{slack.url.split('/chat')[0]}/runs/{run.pk}/" in text  # the run, linked
    assert "*Month*\\nNovember" in text  # params
    assert "total = 1200" in text  # the trail's last values
    # Instructions as Slack markup: bold, a link, and a '<' that cannot become a mention.
    assert "*November*" in text and "<https://ledger.example/nov|ledger>" in text
    assert "&lt;now&gt;" in text
    assert f"<!date^{int(gate.deadline_at.timestamp())}^" in text
    assert "then it rejects itself" in text and "*0 of 2* approvals" in text
    actions = next(b for b in post["blocks"] if b["type"] == "actions")
    assert [e["action_id"] for e in actions["elements"]] == ["tollgate_approve",
                                                              "tollgate_reject"]
    assert ChatMessage.objects.get(step=gate).ref


def test_a_matched_user_approves_once_and_the_message_follows(slack, people):
    run, gate = gate_waiting(people, month="November")
    sso(people["bob"], "bob@acme.test")
    slack.emails["U-BOB"] = "BOB@acme.test"
    status, body = slack.press(slack.url, button(gate, "approve", "U-BOB", "bob"))
    assert (status, body) == (200, b"")
    # Acknowledged first, decided after: the answer Slack waits 3 s for does no deciding.
    assert not Approval.objects.exists()
    assert handle(slack) == ["approved by bob"]
    decision = Approval.objects.get()
    assert (decision.user, decision.channel, decision.chat_identity) == (
        people["bob"], "chat", "slack:T0ACME/U-BOB @bob")
    assert ChatIdentity.objects.get(chat_user="U-BOB").matched_by == "email"
    update = slack.calls_of("chat.update")[-1]
    assert "*1 of 2* approvals" in json.dumps(update["blocks"])
    assert "bob approved via Slack (@bob)" in json.dumps(update["blocks"])

    # A repeat press (a new request, not a replay) counts once and says why.
    slack.press(slack.url, button(gate, "approve", "U-BOB", "bob"))
    assert handle(slack)[0].startswith("refused: bob has already decided")
    assert Approval.objects.count() == 1
    assert "already decided" in slack.calls_of("chat.postEphemeral")[-1]["text"]

    # Carol decides on the web: the message shows the end and no buttons are left.
    carol = Client()
    carol.force_login(people["carol"])
    carol.post(f"/runs/{run.pk}/steps/sign/approve/", {"via": "run_page"})
    final = slack.calls_of("chat.update")[-1]
    assert "Approved by bob, carol" in json.dumps(final["blocks"])
    assert not any(b["type"] == "actions" for b in final["blocks"])
    assert ChatMessage.objects.get(step=gate).final

    # The audit says who decided where.
    audit = carol.get(f"/runs/{run.pk}/audit/").json()["decisions"]
    assert [(d["user"], d["channel"], d["chat_identity"]) for d in audit] == [
        ("bob", "chat", "slack:T0ACME/U-BOB @bob"), ("carol", "run_page", "")]


def test_unmatched_and_ineligible_people_are_refused_privately(slack, people):
    run, gate = gate_waiting(people, month="November")
    slack.press(slack.url, button(gate, "approve", "U-ERIN", "erin"))
    assert handle(slack) == ["not linked"]
    note = slack.calls_of("chat.postEphemeral")[-1]
    assert note["user"] == "U-ERIN" and note["channel"] == "C-QA"
    link = next(w for w in note["text"].split() if "/chat/link/" in w)

    # Slack reports no e-mail for U-ERIN: nobody can confirm the link but an admin.
    erin = Client()
    erin.force_login(people["erin"])
    path = link.split(slack.url.split("/chat")[0])[1]
    page = erin.get(path)
    assert page.status_code == 403 and "reports no e-mail" in page.content.decode()
    assert erin.post(path).status_code == 403 and not ChatIdentity.objects.exists()

    # With her e-mail reported, the page shows what will be linked and what it allows.
    slack.emails["U-ERIN"] = "Erin@acme.test"
    people["erin"].email = "erin@acme.test"
    people["erin"].save()
    slack.press(slack.url, button(gate, "approve", "U-ERIN", "erin"))
    assert handle(slack) == ["not linked"]
    text = slack.calls_of("chat.postEphemeral")[-1]["text"]
    path = next(w for w in text.split() if "/chat/link/" in w).split(
        slack.url.split("/chat")[0])[1]
    page = erin.get(path).content.decode()
    for shown in ("T0ACME", "U-ERIN", "@erin", "Erin@acme.test", "asks to act as you",
                  "decide gates under your name"):
        assert shown in page
    assert erin.post(path).status_code == 200
    assert ChatIdentity.objects.get(chat_user="U-ERIN").user == people["erin"]
    # The link cannot then move the account to someone else.
    dave = Client()
    dave.force_login(people["dave"])
    assert dave.post(path).status_code == 409
    assert ChatIdentity.objects.get(chat_user="U-ERIN").user == people["erin"]

    # Erin is not in qa: refused, with the engine's reason, and nothing recorded.
    slack.press(slack.url, button(gate, "approve", "U-ERIN", "erin"))
    assert handle(slack)[0].startswith("refused:")
    assert "qa" in slack.calls_of("chat.postEphemeral")[-1]["text"]
    # alice started the run: four-eyes holds in chat too.
    people["alice"].groups.add(people["bob"].groups.get())
    ChatIdentity.objects.create(provider="slack", team="T0ACME", chat_user="U-ALICE",
                                user=people["alice"], matched_by="link")
    slack.press(slack.url, button(gate, "approve", "U-ALICE", "alice"))
    assert handle(slack)[0].startswith("refused:")
    assert not Approval.objects.exists()


def test_a_value_in_the_instructions_is_text_in_slack(slack, people):
    gate_waiting(people, month="<@U-ALL> [pay](https://evil.example) *now*")
    text = json.dumps(slack.calls_of("chat.postMessage")[-1])
    assert "<https://ledger.example/nov|ledger>" in text  # the author's link
    assert "evil.example" not in text and "<https://evil" not in text
    assert "<@U-ALL>" not in text and "&lt;@" in text


def test_a_phished_link_links_nothing(slack, people):
    """Mallory names her Slack account "bob" and sends bob her link: the page shows her
    user id and e-mail, and bob cannot confirm it, so she never decides as him."""
    run, gate = gate_waiting(people, month="November")
    people["bob"].email = "bob@acme.test"
    people["bob"].save()
    slack.emails["U-MALLORY"] = "mallory@evil.test"
    slack.press(slack.url, button(gate, "approve", "U-MALLORY", "bob"))
    assert handle(slack) == ["not linked"]
    text = slack.calls_of("chat.postEphemeral")[-1]["text"]
    path = next(w for w in text.split() if "/chat/link/" in w).split(
        slack.url.split("/chat")[0])[1]
    bob = Client()
    bob.force_login(people["bob"])
    page = bob.get(path)
    body = page.content.decode()
    assert page.status_code == 403
    assert "U-MALLORY" in body and "mallory@evil.test" in body and "not yours" in body
    assert bob.post(path).status_code == 403
    assert not ChatIdentity.objects.exists()
    slack.press(slack.url, button(gate, "approve", "U-MALLORY", "bob"))
    assert handle(slack) == ["not linked"]
    assert not Approval.objects.exists()


def test_a_form_or_a_reject_opens_a_modal_whose_submission_decides(slack, people):
    run, gate = gate_waiting(people, spec=ROLLOUT)
    sso(people["bob"], "bob@acme.test")
    slack.emails["U-BOB"] = "bob@acme.test"
    assert slack.press(slack.url, button(gate, "approve", "U-BOB", "bob")) == (200, b"")
    [opened] = slack.calls_of("views.open")
    view = opened["view"]
    assert [b.get("block_id") for b in view["blocks"] if b["type"] == "input"] == [
        "field_rollout", "field_percent", "field_notify", "comment"]
    assert not slack.doorbells  # opening a form decides nothing

    # A wrong form is shown its errors in the modal, and nothing is recorded.
    status, body = slack.press(slack.url, submission(gate, "approve", "U-BOB", "bob",
                                                     values={"percent": "ten"}))
    errors = json.loads(body)
    assert errors["response_action"] == "errors"
    assert set(errors["errors"]) == {"field_rollout", "field_percent"}
    assert not slack.doorbells
    choice = {"type": "static_select", "selected_option": {"value": "canary"}}
    status, body = slack.press(slack.url, submission(
        gate, "approve", "U-BOB", "bob", values={"rollout": choice, "percent": "25",
                                                 "notify": True}, comment="dashboards fine"))
    assert (status, body) == (200, b"")
    assert handle(slack) == ["approved by bob"]
    run.refresh_from_db()
    assert run.shared_state["qa"] == {"rollout": "canary", "percent": 25, "notify": True}
    assert Approval.objects.get().comment == "dashboards fine"


def test_someone_chat_cannot_match_is_told_before_any_form_opens(slack, people):
    """One press, and the link to connect their account: no form filled in for nothing."""
    run, gate = gate_waiting(people, spec=ROLLOUT)
    assert slack.press(slack.url, button(gate, "approve", "U-ERIN", "erin")) == (200, b"")
    assert slack.calls_of("views.open") == [] and not slack.doorbells
    note = slack.calls_of("chat.postEphemeral")[-1]
    assert note["user"] == "U-ERIN" and "/chat/link/" in note["text"]
    assert ChatInteraction.objects.get().outcome == "not linked"
    assert not Approval.objects.exists()


def test_a_reject_needs_its_comment(slack, people):
    run, gate = gate_waiting(people, month="May")
    sso(people["carol"], "carol@acme.test")
    slack.emails["U-CAROL"] = "carol@acme.test"
    slack.press(slack.url, button(gate, "reject", "U-CAROL", "carol"))
    assert "Why?" in json.dumps(slack.calls_of("views.open")[-1]["view"])
    status, body = slack.press(slack.url, submission(gate, "reject", "U-CAROL", "carol"))
    assert json.loads(body)["errors"] == {"comment": "A comment is required to reject."}
    slack.press(slack.url, submission(gate, "reject", "U-CAROL", "carol", comment="wrong month"))
    assert handle(slack) == ["rejected by carol"]
    run.refresh_from_db()
    assert run.status == "failed"
    assert "Ended: wrong month" in json.dumps(slack.calls_of("chat.update")[-1]["blocks"])


def test_forged_stale_and_replayed_requests_are_refused(slack, people):
    run, gate = gate_waiting(people, month="May")
    ChatIdentity.objects.create(provider="slack", team="T0ACME", chat_user="U-BOB",
                                user=people["bob"], matched_by="link")
    payload = button(gate, "approve", "U-BOB", "bob")
    assert slack.press(slack.url, payload, secret="not-the-secret")[0] == 401
    assert slack.press(slack.url, payload, timestamp=int(time.time()) - 301)[0] == 401
    body = slack.body(payload)
    headers = slack.signed(body)
    assert slack.send(slack.url, body, headers)[0] == 200
    status, answer = slack.send(slack.url, body, headers)  # the same request again
    assert status == 401 and b"replay" in answer
    unsigned = {"Content-Type": "application/x-www-form-urlencoded"}
    assert slack.send(slack.url, body, unsigned)[0] == 401
    assert ChatInteraction.objects.count() == 1
    assert handle(slack) == ["approved by bob"]
    assert Approval.objects.count() == 1


def test_slack_away_then_back_loses_nothing(slack, people):
    slack.stop()
    run, gate = gate_waiting(people, month="May")
    message = OutboxMessage.objects.get(job=OutboxJob.CHAT, done_at__isnull=True)
    assert message.attempts == 1 and "URLError" in message.last_error
    # A press that came in before Slack went away is recorded; its private answer waits.
    ChatInteraction.objects.create(provider="slack", digest="d1", payload={
        "kind": "block_actions", "press": {
            "kind": "button", "decision": "approve", "step_id": gate.pk,
            "attempt": gate.attempt, "team": "T0ACME", "chat_user": "U-NEW",
            "chat_name": "new", "channel": "C-QA", "trigger": "", "comment": "",
            "values": {}}})
    press = ChatInteraction.objects.get()
    assert interactions.handle(slack_chat.provider(), press.pk) == "retrying"

    slack.start()
    later = clock.now() + timedelta(hours=2)
    assert outbox.deliver(message.pk, now=later) == "done"
    assert [p["channel"] for p in slack.calls_of("chat.postMessage")] == ["C-QA"]
    assert interactions.due(now=later) == [press.pk]
    assert interactions.handle(slack_chat.provider(), press.pk, now=later) == "not linked"
    assert slack.calls_of("chat.postEphemeral")[0]["user"] == "U-NEW"


def test_a_post_whose_answer_came_too_late_is_found_not_posted_again(slack, people,
                                                                      settings):
    """Slack posts the gate but answers after the client gave up: the outbox retries, and
    the retry finds the message by its metadata (gate and attempt) and adopts it."""
    settings.TOLLGATE_SLACK_TIMEOUT_SECONDS = 0.5
    slack.post_delay = 1.5
    run, gate = gate_waiting(people, month="May")
    message = OutboxMessage.objects.get(job=OutboxJob.CHAT, done_at__isnull=True)
    assert message.attempts == 1 and "timed out" in message.last_error.lower()
    assert len(slack.posted["C-QA"]) == 1  # it was posted all the same
    slack.post_delay = 0
    assert outbox.deliver(message.pk, now=clock.now() + timedelta(hours=1)) == "done"
    assert len(slack.calls_of("chat.postMessage")) == 1  # found, not posted again
    posted = slack.posted["C-QA"][0]
    assert posted["metadata"] == {"event_type": "tollgate_gate",
                                  "event_payload": {"step": gate.pk, "attempt": 1}}
    assert ChatMessage.objects.get(step=gate).ref == posted["ts"]
    # Decisions then update that one message.
    engine.approve(run, "sign", user=people["bob"])
    assert slack.calls_of("chat.update")[-1]["ts"] == posted["ts"]


def test_an_escalated_gate_moves_to_the_new_groups_channel(slack, people):
    spec = {**PAYROLL, "name": "payroll2", "steps": [
        PAYROLL["steps"][0], {**PAYROLL["steps"][1], "approval": {
            "group": "qa", "timeout_seconds": 60, "on_timeout": "escalate",
            "escalate_to": "ops"}}]}
    run, gate = gate_waiting(people, spec=spec, month="May")
    Step.objects.filter(pk=gate.pk).update(deadline_at=clock.now() - timedelta(1))
    engine.expire_gate(gate.pk)
    posts = slack.calls_of("chat.postMessage")
    assert [p["channel"] for p in posts] == ["C-QA", "C-OPS"]
    assert "ops" in json.dumps(slack.calls_of("chat.update")[-1]["blocks"])


def test_a_later_stage_and_a_reassigned_gate_are_posted_to_their_groups_channels(slack,
                                                                               people):
    """Chat follows the gate: the second stage's group sees it in its channel once the first
    is met, and so does the group an operator hands it to; every message keeps up."""
    from tests.conftest import make_user

    make_user("olga", "ops"), make_user("oscar", "ops")
    spec = {**PAYROLL, "name": "staged", "steps": [
        PAYROLL["steps"][0], {**PAYROLL["steps"][1], "approval": {"rules": [
            {"group": "qa", "label": "QA", "order": 0},
            {"group": "ops", "label": "Ops", "order": 1}]}}]}
    run, gate = gate_waiting(people, spec=spec, month="May")
    assert [p["channel"] for p in slack.calls_of("chat.postMessage")] == ["C-QA"]
    engine.approve(run, "sign", user=people["bob"])  # QA met: the ops stage opens
    assert [p["channel"] for p in slack.calls_of("chat.postMessage")] == ["C-QA", "C-OPS"]
    assert "waits on ops" in slack.calls_of("chat.postMessage")[-1]["text"]

    spec2 = {**PAYROLL, "name": "handed"}
    run2, gate2 = gate_waiting(people, spec=spec2, month="June")
    engine.reassign_gate(run2, "sign", actor=people["alice"], reason="qa is away",
                         group="ops")
    assert [p["channel"] for p in slack.calls_of("chat.postMessage")][-2:] == ["C-QA", "C-OPS"]
    assert {m.channel for m in ChatMessage.objects.filter(step=gate2)} == {"C-QA", "C-OPS"}


def test_a_reminder_is_said_in_the_gates_thread_while_it_waits(slack, people):
    from workflows.timing import deadlines

    run, gate = gate_waiting(people, month="November")
    [post] = slack.calls_of("chat.postMessage")
    Step.objects.filter(pk=gate.pk).update(remind_at=clock.now() - timedelta(seconds=1))
    assert deadlines.remind() == 1
    [_, reminder] = slack.calls_of("chat.postMessage")
    ref = ChatMessage.objects.get(step=gate).ref
    assert reminder["channel"] == "C-QA" and reminder["thread_ts"] == ref
    assert reminder["text"].startswith("Reminder: *Finance sign-off* still waits on qa "
                                       "(0 of 2 approvals). Decide by <!date^")
    # Decided before the outbox got to a second reminder: nothing more is said.
    Step.objects.filter(pk=gate.pk).update(remind_at=clock.now() - timedelta(seconds=1))
    engine.approve(run, "sign", user=people["bob"])
    engine.approve(run, "sign", user=people["carol"])
    assert deadlines.remind() == 0
    assert len(slack.calls_of("chat.postMessage")) == 2


def test_a_signed_gate_is_shown_as_one_to_sign_on_its_page(slack, people, settings):
    """A press cannot sign: the message says so, how one signs, and links the page; no
    Approve or Reject to press."""
    settings.TOLLGATE_OIDC_ISSUER = "https://login.acme.example"
    signed = {**PAYROLL, "name": "payroll-signed", "steps": [
        PAYROLL["steps"][0], {**PAYROLL["steps"][1], "approval": {
            **PAYROLL["steps"][1]["approval"],
            "signature": {"meaning": "Approved for payment"}}}, PAYROLL["steps"][2]]}
    run, gate = gate_waiting(people, spec=signed, month="May")
    [post] = slack.calls_of("chat.postMessage")
    text = json.dumps(post["blocks"])
    assert "This gate must be signed* (Approved for payment)" in text
    assert ("signing with your password, a passkey or signing in again at your company's "
            "sign-on") in text
    buttons = [e for b in post["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert [(b["text"]["text"], b.get("url")) for b in buttons] == [
        ("Sign in Tollgate", f"{settings.TOLLGATE_BASE_URL}/runs/{run.pk}/")]
    # Signed on its page, the message follows: the gate decided, no button left.
    for name in ("bob", "carol"):
        engine.approve(run, "sign", user=people[name], signature=engine.Signature(
            user_id=people[name].pk, method="password"))
    update = slack.calls_of("chat.update")[-1]
    assert "Sign in Tollgate" not in json.dumps(update["blocks"])

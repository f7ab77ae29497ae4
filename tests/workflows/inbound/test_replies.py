"""Replies to a gate's mail: the one that decides (from the person's own address, vouched for
by DKIM or a trusted relay, on the same attempt and evidence), and every other kind, which
decides nothing: forged, unsigned, replayed, forwarded, from another approver of the group,
automatic, altered, late, or for a gate a reply cannot decide."""

from __future__ import annotations

import pytest
from django.core import mail

from tests.support import mail as mails
from workflows import engine
from workflows.delivery import links, notifications
from workflows.inbound import replies
from workflows.models import Approval, Checkpoint, MailReply, Notification, Step, StepStatus
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

DOMAIN = "reply.tollgate.example.org"


@pytest.fixture(autouse=True)
def _replies_on(settings):
    settings.TOLLGATE_REPLY_DOMAIN = DOMAIN
    settings.TOLLGATE_INBOUND_TRUSTED_RELAYS = ["mx.tollgate.example.org"]


@pytest.fixture
def gate(waiting):
    return waiting.steps.get(key="qa")


def mailed_reply_to(gate, who) -> str:
    """The Reply-To of the gate's mail to this person, as it was sent."""
    checkpoint = Checkpoint.objects.filter(run=gate.run).last()
    notifications.deliver(checkpoint.pk, [("gate_waiting", gate.key)])
    sent = next(m for m in mail.outbox if m.to == [who.email] and "waits on" in m.subject)
    return sent.extra_headers["Reply-To"]


def decided(gate) -> list[tuple[str, str, str]]:
    return list(Approval.objects.filter(step=gate).values_list(
        "user__username", "decision", "channel"))


def answers_to(who) -> list:
    return [m for m in mail.outbox if m.to == [who.email] and m.subject.startswith("Re:")]


def test_a_reply_saying_approve_from_the_persons_own_domain_decides(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "Bob <bob@example.com>", "Approve - tested on staging\nall good")
    received = replies.receive(raw, via="mta")
    assert received.decided, received.outcome
    row = Approval.objects.get(step=gate)
    assert (row.user, row.decision, row.channel, row.comment) == (
        people["bob"], "approve", "mail_reply", "tested on staging\nall good")
    message_id = MailReply.objects.get().message_id
    assert row.chat_identity == message_id
    checkpoint = Checkpoint.objects.filter(run=gate.run).last()
    assert checkpoint.evidence["channel"] == "mail_reply"
    assert checkpoint.evidence["message_id"] == message_id
    answer = answers_to(people["bob"])[-1]
    assert "You approved QA sign-off." in answer.body
    assert answer.extra_headers["In-Reply-To"] == message_id
    assert answer.extra_headers["Auto-Submitted"] == "auto-replied"


def test_a_reply_saying_reject_fails_the_gate_with_its_reason(gate, people):
    to = mailed_reply_to(gate, people["carol"])
    received = replies.receive(mails.reply(to, "carol@example.com", "reject: login broken"),
                               via="mta")
    assert received.decided, received.outcome
    gate.refresh_from_db()
    assert gate.status == StepStatus.FAILED
    assert Approval.objects.get(step=gate).comment == "login broken"


def test_the_reply_address_is_a_short_lower_case_local_part_that_survives_case_folding(
        gate, people):
    to = mailed_reply_to(gate, people["bob"])
    local = to.partition("@")[0]
    assert len(local) <= 64 and local == local.lower()
    assert links.read_reply_address(to.upper()).user_id == people["bob"].pk
    altered = to.replace(".", ".0", 1)
    assert links.read_reply_address(altered) is None


@pytest.mark.parametrize("signed_by, relay, why", [
    ("evil.example.net", "", "no DKIM signature of example.com verified"),
    (None, "", "no DKIM signature of example.com verified"),
    (None, "mx.elsewhere.example.net; dkim=pass header.d=example.com",
     "no DKIM signature of example.com verified"),
    (None, "mx.tollgate.example.org; dkim=fail header.d=example.com",
     "no DKIM signature of example.com verified"),
])
def test_a_reply_nobody_vouches_for_decides_nothing_and_the_person_is_told(
        gate, people, signed_by, relay, why):
    to = mailed_reply_to(gate, people["bob"])
    headers = {"Authentication-Results": relay} if relay else {}
    received = replies.receive(mails.reply(to, "bob@example.com", "approve",
                                           signed_by=signed_by, headers=headers), via="mta")
    assert not received.decided and why in received.outcome
    assert decided(gate) == []
    told = answers_to(people["bob"])[-1]
    assert "decided nothing" in told.body and "someone tried to decide in your name" in told.body
    assert (people["bob"].pk, gate.pk, gate.attempt) in mails.decision_links(told.body)


def test_a_trusted_relays_verdict_vouches_for_an_unsigned_reply(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve", signed_by=None, headers={
        "Authentication-Results": "mx.tollgate.example.org; dkim=pass header.d=example.com"})
    assert replies.receive(raw, via="mta").decided
    assert decided(gate) == [("bob", "approve", "mail_reply")]


def test_a_signature_over_part_of_the_body_vouches_for_nothing(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve", body_length=True)
    assert not replies.receive(raw, via="mta").decided


def test_a_message_delivered_again_decides_once_and_is_answered_once(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve")
    assert replies.receive(raw, via="mta").decided
    again = replies.receive(raw, via="mta")
    assert not again.decided and "a replay" in again.outcome and not again.answered
    assert len(answers_to(people["bob"])) == 1
    assert decided(gate) == [("bob", "approve", "mail_reply")]


def test_a_second_reply_of_the_same_person_is_refused_by_the_engine(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    assert replies.receive(mails.reply(to, "bob@example.com", "approve"), via="mta").decided
    second = replies.receive(mails.reply(to, "bob@example.com", "reject: no"), via="mta")
    assert not second.decided and "not recorded" in second.outcome
    assert decided(gate) == [("bob", "approve", "mail_reply")]


def test_another_approver_of_the_group_replying_with_the_mail_decides_nothing(gate, people):
    """bob forwards his mail to carol (also in qa), who replies from her own, signed,
    address: the reply address is bob's, so it is refused, and bob is told."""
    to = mailed_reply_to(gate, people["bob"])
    received = replies.receive(mails.reply(to, "carol@example.com", "approve"), via="mta")
    assert not received.decided
    assert "not from bob@example.com" in received.outcome
    assert decided(gate) == []
    assert answers_to(people["bob"]) and not answers_to(people["carol"])


def test_a_forward_decides_nothing(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve", subject="Fwd: [Tollgate] QA sign-off")
    assert "a forward" in replies.receive(raw, via="mta").outcome
    assert decided(gate) == []


@pytest.mark.parametrize("headers", [{"Auto-Submitted": "auto-replied"},
                                     {"X-Autoreply": "yes"}, {"Precedence": "auto_reply"}])
def test_an_automatic_reply_decides_nothing_and_is_not_answered(gate, people, headers):
    to = mailed_reply_to(gate, people["bob"])
    received = replies.receive(mails.reply(to, "bob@example.com", "approve, I am away",
                                           headers=headers), via="mta")
    assert not received.decided and not received.answered
    assert "automatic reply" in received.outcome
    assert answers_to(people["bob"]) == []


def test_a_second_from_header_decides_nothing(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve")
    forged = b"From: carol@example.com\r\n" + raw
    assert not replies.receive(forged, via="mta").decided


def test_a_reply_after_the_gate_started_again_or_changed_decides_nothing(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    Step.objects.filter(pk=gate.pk).update(evidence_digest="0" * 64)
    changed = replies.receive(mails.reply(to, "bob@example.com", "approve"), via="mta")
    assert "changed after that mail was written" in changed.outcome
    Step.objects.filter(pk=gate.pk).update(attempt=gate.attempt + 1)
    again = replies.receive(mails.reply(to, "bob@example.com", "approve"), via="mta")
    assert "started again" in again.outcome
    assert decided(gate) == []


def test_a_first_line_that_says_neither_decides_nothing_and_says_so(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    received = replies.receive(mails.reply(to, "bob@example.com", "Looks good to me"),
                               via="mta")
    assert "its first line ('Looks good to me') says neither approve nor reject" in (
        received.outcome)
    assert decided(gate) == []


def test_an_altered_address_decides_nothing_and_no_one_is_mailed(gate, people):
    to = mailed_reply_to(gate, people["bob"])
    local, _, domain = to.partition("@")
    ids, _, mac = local.rpartition(".")
    raw = mails.reply(f"{ids}.{'a' * len(mac)}@{domain}", "bob@example.com", "approve")
    before = len(mail.outbox)
    received = replies.receive(raw, via="mta")
    assert not received.decided and "not addressed to a reply address" in received.outcome
    assert len(mail.outbox) == before and not MailReply.objects.exists()


def test_a_gate_that_must_be_signed_has_no_reply_address_and_a_reply_is_sent_to_its_page(
        people):
    spec = store_spec({"name": "signed", "steps": [
        {"key": "qa", "title": "QA sign-off", "approval": {
            "group": "qa", "signature": {"meaning": "I tested this release"}}}]})[0]
    run = engine.open_run(spec, actor=people["alice"]).run
    gate = run.steps.get(key="qa")
    checkpoint = Checkpoint.objects.filter(run=run).last()
    notifications.deliver(checkpoint.pk, [("gate_waiting", "qa")])
    sent = next(m for m in mail.outbox if m.to == [people["bob"].email])
    assert "Reply-To" not in sent.extra_headers and "reply to this mail" not in sent.body
    to = links.reply_address(people["bob"], gate)  # made by hand: the mail has none
    received = replies.receive(mails.reply(to, "bob@example.com", "approve"), via="mta")
    assert not received.decided and "it must be signed" in received.outcome
    assert (people["bob"].pk, gate.pk, gate.attempt) in mails.decision_links(
        answers_to(people["bob"])[-1].body)


def test_replies_off_no_reply_address_and_mail_to_one_is_dropped(gate, people, settings):
    to = mailed_reply_to(gate, people["bob"])
    settings.TOLLGATE_REPLY_DOMAIN = ""
    mail.outbox.clear()
    Notification.objects.all().delete()
    checkpoint = Checkpoint.objects.filter(run=gate.run).last()
    notifications.deliver(checkpoint.pk, [("gate_waiting", "qa")])
    assert all("Reply-To" not in m.extra_headers for m in mail.outbox)
    assert not replies.receive(mails.reply(to, "bob@example.com", "approve"),
                               via="mta").decided


@pytest.mark.django_db(transaction=True)
def test_one_reply_delivered_twice_at_once_decides_once(gate, people):
    """Two mail servers (or a retry racing the first try) hand over the same reply at the
    same moment: one decides, the other finds its Message-ID taken."""
    from django.db import connection

    from tests.workflows.test_concurrency import race

    if connection.vendor != "postgresql":
        pytest.skip("two writers at once: PostgreSQL")
    to = mailed_reply_to(gate, people["bob"])
    raw = mails.reply(to, "bob@example.com", "approve")
    outcomes = [received.decided for received in race(
        2, lambda i: replies.receive(raw, via="mta"))]
    assert sorted(outcomes) == [False, True]
    assert decided(gate) == [("bob", "approve", "mail_reply")]
    assert MailReply.objects.count() == 1


def test_refused_replies_are_answered_at_most_ten_times_an_hour(gate, people):
    """Whoever holds a person's reply address cannot have Tollgate mail them without end:
    after ten refused replies in an hour, the next ones are recorded and not answered."""
    to = mailed_reply_to(gate, people["bob"])
    outcomes = [replies.receive(mails.reply(to, "bob@example.com", f"Looks fine {i}"),
                                via="mta") for i in range(12)]
    assert [o.answered for o in outcomes] == [True] * 10 + [False] * 2
    assert len(answers_to(people["bob"])) == 10
    assert "not answered: 10 refused replies in the last hour" in outcomes[-1].outcome
    assert MailReply.objects.filter(decided=False).count() == 12
    # A reply that decides is still taken, and answered.
    done = replies.receive(mails.reply(to, "bob@example.com", "Approve"), via="mta")
    assert done.decided and done.answered and decided(gate) == [("bob", "approve",
                                                                "mail_reply")]

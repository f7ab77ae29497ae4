"""Notifications: who hears of what, once per event per person, whatever the retries."""

from __future__ import annotations

import pytest
from django.core import mail

from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import notifications, outbox
from workflows.delivery.outbox import notification_events
from workflows.engine import Announcement
from workflows.models import Checkpoint, Notification

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(settings, monkeypatch, django_capture_on_commit_callbacks):
    """Deliver notifications in-process, as the Huey task would, and count deliveries."""
    settings.TOLLGATE_NOTIFY = True
    calls = []

    def deliver(message_id):
        calls.append(message_id)
        outbox.deliver(message_id)

    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", deliver)
    return calls


def recipients(subject_part: str) -> set[str]:
    return {to for m in mail.outbox if subject_part in m.subject for to in m.to}


def test_gate_waiting_tells_the_group_but_not_the_requester(release_spec, people, sent,
                                                            django_capture_on_commit_callbacks):
    people["alice"].groups.add(people["bob"].groups.get())  # alice is in qa too
    run = engine.open_run(release_spec, actor=people["alice"]).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "build")
    assert recipients("waits on qa") == {"bob@example.com", "carol@example.com"}


def test_decision_and_failure_tell_the_requester(release_spec, people, sent,
                                                 django_capture_on_commit_callbacks):
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    with django_capture_on_commit_callbacks(execute=True):
        engine.reject(run, "qa", user=people["bob"], comment="broken login")
    assert recipients("QA sign-off rejected") == {"alice@example.com"}
    assert recipients("Run failed") == {"alice@example.com"}
    assert "broken login" in next(m.body for m in mail.outbox if "rejected" in m.subject)


def test_a_retried_task_never_sends_twice(release_spec, people):
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    checkpoint = Checkpoint.objects.filter(run=run).last()
    events = notification_events(Announcement(run.pk, checkpoint, "waiting_approval", "open"))
    assert events == [("gate_waiting", "qa")]
    assert notifications.deliver(checkpoint.pk, events) == 2
    assert notifications.deliver(checkpoint.pk, events) == 0  # the task ran again
    assert len(mail.outbox) == 2 and Notification.objects.count() == 2
    assert all(n.sent_at for n in Notification.objects.all())


def test_escalation_tells_the_new_group_and_the_requester(db, people, sent,
                                                          django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import Step
    from workflows.specs.storage import store_spec
    from workflows.timing import deadlines

    people["erin"].groups.add(people["dave"].groups.get())
    spec = store_spec({"name": "esc", "steps": [{"key": "ok", "approval": {
        "group": "qa", "timeout_seconds": 60, "on_timeout": "escalate",
        "escalate_to": "managers"}}]})[0]
    run = engine.open_run(spec, actor=people["alice"]).run
    Step.objects.filter(run=run).update(deadline_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        deadlines.apply()
    assert recipients("escalated to managers") == {"dave@example.com", "erin@example.com"}
    assert recipients("escalated:") == {"alice@example.com"}


def test_mail_owed_while_the_queue_is_down_is_sent_when_it_returns(
        release_spec, people, settings, monkeypatch, django_capture_on_commit_callbacks):
    """The duty is a row written with the transition; the periodic task rings for it once,
    whoever ticks, and it is delivered once."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.delivery import dispatch
    from workflows.models import OutboxMessage

    settings.TOLLGATE_NOTIFY = True

    def queue_down(*args, **kwargs):
        raise ConnectionError("Redis is down")

    monkeypatch.setitem(dispatch._tasks, "deliver_outbox", queue_down)
    run = engine.open_run(release_spec, actor=people["alice"]).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "build")  # the gate opens; its mail cannot be rung
    message = OutboxMessage.objects.get()
    assert message.done_at is None and mail.outbox == []
    assert outbox.due_to_ring() == []  # rung a moment ago: not again at once
    later = timezone.now() + timedelta(seconds=3 * settings.TOLLGATE_SWEEP_SECONDS)
    assert outbox.due_to_ring(later) == [message.pk]
    assert outbox.due_to_ring(later) == []  # a second consumer ticking: nothing to ring
    assert outbox.deliver(message.pk) == "done"
    assert recipients("waits on qa") == {"bob@example.com", "carol@example.com"}
    assert outbox.deliver(message.pk) == "not due"  # delivered once
    assert len(mail.outbox) == 2


def test_a_failed_delivery_is_retried_with_backoff(release_spec, people, settings,
                                                   monkeypatch):
    from workflows.models import OutboxMessage

    settings.TOLLGATE_NOTIFY = True
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    message = OutboxMessage.objects.get()

    def broken(*args):
        raise OSError("SMTP server refused")

    monkeypatch.setattr(notifications, "deliver", broken)
    assert outbox.deliver(message.pk) == "retrying"
    message.refresh_from_db()
    assert message.attempts == 1 and "SMTP server refused" in message.last_error
    assert message.next_attempt_at > message.created_at
    assert outbox.deliver(message.pk) == "not due"


def test_mail_sent_while_the_smtp_server_is_down_goes_when_it_is_back(release_spec, people,
                                                                      settings):
    """A real SMTP conversation: the server is down when the gate waits, so each mail stays
    pending with its error; once the server answers, the due retry sends every one, once."""
    from datetime import timedelta

    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Sink

    from tests.support.processes import free_port
    from workflows.timing import clock

    port = free_port()
    settings.MAILERS = {"default": {
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {"host": "127.0.0.1", "port": port, "timeout": 5}}}
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    checkpoint = Checkpoint.objects.filter(run=run).last()
    assert notifications.deliver(checkpoint.pk, [("gate_waiting", "qa")]) == 0
    pending = Notification.objects.filter(sent_at=None)
    assert pending.count() == 2 and all(n.attempts == 1 and n.error for n in pending)
    assert notifications.send_due() == 0  # not due yet: nothing is tried before its time

    class Received(Sink):
        def __init__(self):
            self.to = []

        async def handle_DATA(self, server, session, envelope):
            self.to += envelope.rcpt_tos
            return "250 OK"

    handler = Received()
    server = Controller(handler, hostname="127.0.0.1", port=port)
    server.start()
    try:
        later = clock.now() + timedelta(seconds=notifications.RETRY_DELAYS[0] + 1)
        assert notifications.send_due(now=later) == 2
        assert notifications.send_due(now=later + timedelta(hours=1)) == 0
    finally:
        server.stop()
    assert sorted(handler.to) == ["bob@example.com", "carol@example.com"]
    assert all(n.sent_at and n.attempts == 2 and not n.error
               for n in Notification.objects.all())


def test_a_mail_the_server_keeps_refusing_is_given_up_after_its_retries(release_spec, people,
                                                                       monkeypatch):
    from datetime import timedelta

    from workflows.timing import clock

    monkeypatch.setattr(notifications.EmailMultiAlternatives, "send",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("refused")))
    run = engine.open_run(release_spec, actor=people["alice"]).run
    work(run, "build")
    checkpoint = Checkpoint.objects.filter(run=run).last()
    notifications.deliver(checkpoint.pk, [("gate_waiting", "qa")])
    now = clock.now()
    for _ in notifications.RETRY_DELAYS:
        now += timedelta(days=1)
        notifications.send_due(now=now)
    assert all(n.next_attempt_at is None and n.sent_at is None and "refused" in n.error
               and n.attempts == len(notifications.RETRY_DELAYS) + 1
               for n in Notification.objects.all())


@pytest.mark.parametrize("behind", [1.5, -1.5])
def test_a_duty_is_due_at_once_whatever_the_database_clock_says(
        release_spec, people, sent, monkeypatch, django_capture_on_commit_callbacks, behind):
    """Due times are written and read on one clock, the database's: with the database's
    clock 1.5 s behind (or ahead of) this machine's, the mail a gate owes still goes the
    moment its transition commits, not a periodic ring later."""
    import time
    from datetime import timedelta

    from django.utils import timezone

    from workflows.timing import clock

    wall, mono = timezone.now(), time.monotonic()
    monkeypatch.setattr(clock, "_base", (wall - timedelta(seconds=behind), wall, mono))
    monkeypatch.setattr(clock, "_checked", mono)
    run = engine.open_run(release_spec, actor=people["alice"]).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "build")
    assert len(sent) == 1
    assert recipients("waits on qa") == {"bob@example.com", "carol@example.com"}
    assert Notification.objects.filter(sent_at=None).count() == 0


def test_no_mail_of_a_staged_gate_reads_wrong_words(db, people, settings):
    """A manager stage in mail: "waits on dave (alice's manager)", and no "( ", "waits on :"
    or "Approve Approve" in any subject or body of any event a staged gate sends."""
    import re

    from workflows import engine
    from workflows.delivery.notifications import messages_for
    from workflows.models import Checkpoint, Preference
    from workflows.specs.storage import store_spec

    settings.TOLLGATE_NOTIFY = True
    Preference.objects.create(user=people["alice"], manager=people["dave"])
    people["dave"].email = "dave@example.com"
    people["dave"].save()
    store_spec({"name": "pay", "steps": [{"key": "approve", "title": "Approve the payment",
                                          "approval": {"rules": [
                                              {"group": "qa", "order": 0},
                                              {"manager": True, "group": "qa", "order": 1}]}}]})
    run = engine.open_run("pay", actor=people["alice"]).run
    engine.approve(run, "approve", user=people["bob"])  # the manager's stage opens
    wrong = re.compile(r"\( |waits on :|waiting on :|Approve Approve| :\s")
    texts = []
    for checkpoint in Checkpoint.objects.filter(run=run).order_by("seq"):
        for _, subject, body, _, _ in messages_for(checkpoint, "gate_waiting", "approve"):
            texts.append(subject + "\n" + body)
    engine.approve(run, "approve", user=people["dave"])
    last = Checkpoint.objects.filter(run=run).order_by("-seq").first()
    texts += [s + "\n" + b for _, s, b, _, _ in messages_for(last, "gate_decided", "approve")]
    assert any("waits on dave (alice's manager)" in text for text in texts), texts
    assert [text for text in texts if wrong.search(text)] == []


def test_a_signed_gates_mail_says_it_must_be_signed_and_what_it_means(people, sent,
                                                                     django_capture_on_commit_callbacks):
    from workflows.specs.storage import store_spec

    spec = store_spec({"name": "signed", "steps": [{"key": "qa", "approval": {
        "group": "qa", "signature": {"meaning": "Approved for release",
                                     "reject_meaning": "Held back"}}}]})[0]
    with django_capture_on_commit_callbacks(execute=True):
        engine.open_run(spec, actor=people["alice"])
    to_bob = next(m for m in mail.outbox if m.to == ["bob@example.com"])
    said = 'It must be signed: approving means "Approved for release", rejecting means ' \
           '"Held back".'
    assert said in to_bob.body
    assert "<strong>It must be signed</strong>" in to_bob.alternatives[0][0]


def test_an_unsigned_gates_mail_says_nothing_of_signing(release_spec, people, sent,
                                                       django_capture_on_commit_callbacks):
    run = engine.open_run(release_spec, actor=people["alice"]).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "build")
    to_bob = next(m for m in mail.outbox if m.to == ["bob@example.com"])
    assert "waits on qa" in to_bob.subject and "must be signed" not in to_bob.body

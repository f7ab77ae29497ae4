"""Signed decision links in mail, the base URL they are built on, and webhooks posted to a
receiver on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone

from tests.conftest import make_user
from workflows import engine
from workflows.delivery import links, notifications, webhooks
from workflows.delivery.outbox import notification_events
from workflows.models import Approval, Checkpoint, Step, Webhook, WebhookDelivery

pytestmark = pytest.mark.django_db


def gate_of(run) -> Step:
    return Step.objects.get(run=run, key="qa")


class TestDecisionLinks:
    def test_the_mail_carries_an_absolute_link_signed_for_each_person(self, waiting, people):
        checkpoint = Checkpoint.objects.filter(run=waiting).last()
        notifications.deliver(checkpoint.pk, [("gate_waiting", "qa")])
        to_bob = next(m for m in mail.outbox if m.to == ["bob@example.com"])
        link = next(w for w in to_bob.body.split() if "/decide/" in w)
        assert link.startswith("http://testserver/decide/")
        assert f"http://testserver/runs/{waiting.pk}/" in to_bob.body
        to_carol = next(m for m in mail.outbox if m.to == ["carol@example.com"])
        assert link not in to_carol.body  # each person's link is their own

    def test_the_link_opens_the_gate_with_its_evidence_and_decides_nothing(self, waiting,
                                                                          people):
        url = links.decision_url(people["bob"], gate_of(waiting)).removeprefix(
            "http://testserver")
        client = Client()
        assert client.get(url).status_code == 302  # signing in first
        client.force_login(people["bob"])
        page = client.get(url)
        assert page.status_code == 200
        html = page.content.decode()
        assert "QA sign-off" in html and "Approve" in html and "Release 1.0" in html
        assert not Approval.objects.exists() and gate_of(waiting).status == "waiting_approval"
        approve = client.post(f"/runs/{waiting.pk}/steps/qa/approve/",
                              {"view": "inbox", "comment": "from the link"},
                              HTTP_HX_REQUEST="true")
        assert approve.status_code == 200
        assert Approval.objects.get().comment == "from the link"

    def test_a_refused_decision_from_the_link_redraws_its_card_as_it_was(self, waiting,
                                                                          people):
        """Who else may decide and who was told, as before; no checkbox for several gates;
        and the next press still says it came from the mailed link."""
        client = Client()
        client.force_login(people["bob"])
        refused = client.post(f"/runs/{waiting.pk}/steps/qa/reject/",
                              {"view": "inbox", "via": "mail_link", "comment": ""},
                              HTTP_HX_REQUEST="true")
        assert refused.status_code == 400
        card = refused.content.decode()
        assert "A comment is required to reject" in card
        assert "Also may decide: <bdi>carol</bdi>" in card
        assert 'name="gate"' not in card and 'form="bulk"' not in card
        assert 'name="via" value="mail_link"' in card
        client.post(f"/runs/{waiting.pk}/steps/qa/reject/",
                    {"view": "inbox", "via": "mail_link", "comment": "broken"},
                    HTTP_HX_REQUEST="true")
        assert Approval.objects.get().channel == "mail_link"

    def test_the_link_carries_what_the_mail_showed_and_its_page_says_when_it_changed(
            self, people):
        """Nobody had decided, so a change of the evidence started no new attempt: the page
        the mailed link opens says the gate changed since the mail, and its form carries the
        evidence shown now."""
        from workflows.specs.storage import store_spec

        store_spec({"name": "mailed", "steps": [
            {"key": "qa", "title": "QA sign-off", "approval": {"group": "qa"}},
            {"key": "notes"}]})
        run = engine.open_run("mailed", actor=people["alice"],
                              shared_state={"artifact": "v1"}).run
        url = links.decision_url(people["bob"], gate_of(run)).removeprefix("http://testserver")
        client = Client()
        client.force_login(people["bob"])
        assert 'id="changed-since-mail"' not in client.get(url).content.decode()
        engine.record_transition(run, "notes", actor="agent", step_status="running",
                                 state_patch={"artifact": "v2"})
        page = client.get(url).content.decode()
        assert 'id="changed-since-mail"' in page
        assert f'value="{gate_of(run).evidence_digest}"' in page

    def test_the_link_stops_working_once_the_gate_is_decided_or_started_again(self, waiting,
                                                                              people):
        url = links.decision_url(people["bob"], gate_of(waiting)).removeprefix(
            "http://testserver")
        client = Client()
        client.force_login(people["bob"])
        engine.approve(waiting, "qa", user=people["carol"])
        engine.reject(waiting, "qa", user=make_user("quinn", "qa"), comment="not yet")
        gone = client.get(url)
        assert gone.status_code == 410 and "no longer works" in gone.content.decode()
        engine.retry_step(waiting, "qa")  # a new attempt: the old link stays dead
        assert client.get(url).status_code == 410
        fresh = links.decision_url(people["bob"], gate_of(waiting)).removeprefix(
            "http://testserver")
        assert client.get(fresh).status_code == 200

    def test_a_link_is_only_for_the_person_it_was_sent_to(self, waiting, people):
        url = links.decision_url(people["bob"], gate_of(waiting)).removeprefix(
            "http://testserver")
        client = Client()
        client.force_login(people["carol"])
        refused = client.get(url)
        assert refused.status_code == 403 and "another person" in refused.content.decode()

    def test_an_altered_or_expired_link_is_refused(self, waiting, people, settings):
        url = links.decision_url(people["bob"], gate_of(waiting)).removeprefix(
            "http://testserver")
        client = Client()
        client.force_login(people["bob"])
        assert client.get(url[:-3] + "xyz/").status_code == 400
        settings.TOLLGATE_DECISION_LINK_DAYS = -1
        expired = client.get(url)
        assert expired.status_code == 400 and "expired" in expired.content.decode()


class TestBaseUrl:
    @pytest.mark.parametrize("base, problem", [
        ("", "tollgate.E001"), ("tollgate.example.com", "tollgate.E001"),
        ("http://tollgate.example.com", "tollgate.W001")])
    def test_the_deploy_check_asks_for_an_absolute_https_base_url(self, base, problem):
        from django.core.management.base import SystemCheckError

        with override_settings(TOLLGATE_BASE_URL=base), pytest.raises(
                SystemCheckError, match=problem):
            call_command("check", deploy=True, fail_level="WARNING", tags=["security"])

    def test_a_good_base_url_passes(self):
        from workflows.ops.checks import base_url

        with override_settings(TOLLGATE_BASE_URL="https://tollgate.example.com"):
            assert base_url(None) == []


class Receiver:
    """An HTTP server on 127.0.0.1 that records posts and answers with the codes it is given."""

    def __init__(self, codes):
        self.codes, self.posts = list(codes), []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append((dict(self.headers), body))
                self.send_response(receiver.codes.pop(0) if receiver.codes else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/tollgate"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def local_receivers(settings):
    """The receivers here listen on 127.0.0.1 over http: allowed for these tests only."""
    settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE = True
    settings.TOLLGATE_WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]


@pytest.fixture
def receiver():
    started = []

    def start(*codes):
        started.append(Receiver(codes))
        return started[-1]

    yield start
    for server in started:
        server.close()


class TestWebhooks:
    def events(self, run):
        from workflows.engine import Announcement

        checkpoint = Checkpoint.objects.filter(run=run).last()
        return checkpoint, notification_events(Announcement(run.pk, checkpoint, "", ""))

    def test_a_waiting_gate_is_posted_signed_to_its_group(self, waiting, people, receiver):
        server = receiver(200)
        Webhook.objects.create(group="qa", url=server.url, secret="s3cret")
        Webhook.objects.create(group="legal", url=server.url, secret="other")  # not qa's
        checkpoint, events = self.events(waiting)
        planned = webhooks.plan(checkpoint.pk, events)
        assert len(planned) == 1 and webhooks.plan(checkpoint.pk, events) == []  # once
        assert webhooks.deliver(planned[0]) == "delivered"
        headers, body = server.posts[0]
        expected = "sha256=" + hmac.new(b"s3cret", headers["X-Tollgate-Timestamp"].encode()
                                        + b"." + body, hashlib.sha256).hexdigest()
        assert headers["X-Tollgate-Signature"] == expected
        assert headers["X-Tollgate-Event"] == "gate_waiting"
        sent = json.loads(body)
        assert sent["gate"]["key"] == "qa" and sent["gate"]["group"] == "qa"
        assert sent["gate"]["status"] == "waiting_approval"  # the gate's, not build's
        assert sent["run"]["url"] == f"http://testserver/runs/{waiting.pk}/"
        assert sent["delivery"] == planned[0]
        record = WebhookDelivery.objects.get()
        assert (record.status, record.attempts, record.last_status_code) == ("delivered", 1, 200)

    def test_a_refused_post_is_retried_and_each_attempt_recorded(self, waiting, people,
                                                                 receiver):
        server = receiver(500, 503, 200)
        Webhook.objects.create(group="qa", url=server.url, secret="s")
        checkpoint, events = self.events(waiting)
        [delivery] = webhooks.plan(checkpoint.pk, events)
        assert webhooks.deliver(delivery) == "pending"
        record = WebhookDelivery.objects.get()
        assert (record.attempts, record.last_status_code) == (1, 500)
        assert webhooks.deliver(delivery) == "pending"  # not due yet: nothing posted
        assert len(server.posts) == 1
        later = timezone.now() + timedelta(hours=1)
        assert webhooks.due(later) == [delivery]
        assert webhooks.deliver(delivery, now=later) == "pending"
        assert webhooks.deliver(delivery, now=later + timedelta(hours=1)) == "delivered"
        record.refresh_from_db()
        assert (record.attempts, record.status, len(server.posts)) == (3, "delivered", 3)
        assert len({h["X-Tollgate-Delivery"] for h, _ in server.posts}) == 1

    def test_an_unreachable_receiver_fails_after_the_last_attempt(self, waiting, people):
        Webhook.objects.create(group="qa", url="http://127.0.0.1:9/nothing", secret="s")
        checkpoint, events = self.events(waiting)
        [delivery] = webhooks.plan(checkpoint.pk, events)
        when = timezone.now()
        for _ in range(len(webhooks.RETRY_DELAYS) + 1):
            status = webhooks.deliver(delivery, now=when)
            when += timedelta(days=1)
        record = WebhookDelivery.objects.get()
        assert status == "failed" and record.attempts == len(webhooks.RETRY_DELAYS) + 1
        assert record.last_error == "no HTTP answer" and record.last_status_code is None

    def test_a_decision_is_posted_with_who_decided_and_the_values(self, waiting, people,
                                                                  receiver):
        server = receiver()
        Webhook.objects.create(group="qa", url=server.url, secret="s")
        engine.approve(waiting, "qa", user=people["bob"], comment="fine")
        engine.approve(waiting, "qa", user=people["carol"], comment="ship it")
        checkpoint, events = self.events(waiting)
        assert ("gate_decided", "qa") in events
        for delivery in webhooks.plan(checkpoint.pk, events):
            webhooks.deliver(delivery)
        sent = json.loads(server.posts[-1][1])
        assert sent["event"] == "gate_decided"
        assert sent["decision"]["outcome"] == "approved" and sent["decision"]["by"] == "carol"

    def test_the_transition_writes_its_webhooks_to_the_outbox_and_rings_after_it_commits(
            self, waiting, people, settings, monkeypatch, django_capture_on_commit_callbacks):
        from workflows.models import OutboxMessage

        settings.TOLLGATE_WEBHOOKS = True
        rung = []
        monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", rung.append)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            engine.reject(waiting, "qa", user=people["bob"], comment="broken")
        message = OutboxMessage.objects.get()  # written in the transition's transaction
        assert message.job == "webhooks" and message.events == [["gate_decided", "qa"]]
        assert rung == []
        for callback in callbacks:
            callback()
        assert rung == [message.pk]


@pytest.mark.consumer
@pytest.mark.django_db(transaction=True)
def test_a_real_consumer_posts_a_waiting_gate_to_the_receiver(consumers, settings, receiver,
                                                              release_spec, people):
    from tests.workflows.consumers import wait_for

    settings.TOLLGATE_WEBHOOKS = True
    server = receiver(500, 200)  # refused once, then taken
    Webhook.objects.create(group="qa", url=server.url, secret="s")
    consumers(workers=2, TOLLGATE_WEBHOOKS="1", TOLLGATE_WEBHOOK_ALLOW_PRIVATE="1",
              TOLLGATE_WEBHOOK_HTTP_HOSTS="127.0.0.1")
    run = engine.open_run(release_spec, actor=people["alice"]).run
    wait_for(lambda: server.posts, 30, what="the webhook post")
    # The receiver hears the post before the consumer records its answer: read once it has.
    record = wait_for(lambda: WebhookDelivery.objects.filter(attempts__gt=0).first(), 30,
                      what="the refused attempt recorded")
    assert WebhookDelivery.objects.count() == 1
    assert record.run_id == run.pk and record.event == "gate_waiting"
    assert record.attempts == 1 and record.last_status_code == 500 and record.status == "pending"
    # The retry is scheduled; here it is brought forward, as the periodic task would find it.
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    from workflows.delivery import dispatch

    dispatch.deliver_webhook(record.pk)
    wait_for(lambda: WebhookDelivery.objects.get().status == "delivered", 30,
             what="the retried post")
    assert len(server.posts) == 2

"""Push to the phone: a browser subscribes on the profile (POST /push/subscriptions/); a gate
waiting on its person, a reminder and an escalation reach the push service encrypted to that
browser (decrypted here with its keys) and signed with the deployment's VAPID key; the
notification opens the gate's page with the choice made, where one press decides; a browser
the push service says is gone is dropped."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.support.mail import decision_links
from tests.support.push import PushService, Subscriber, vapid_claims
from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import links, outbox, push
from workflows.models import Approval, Checkpoint, OutboxMessage, PushSubscription, Step

pytestmark = pytest.mark.django_db


@pytest.fixture
def service(settings, tmp_path):
    settings.TOLLGATE_VAPID_KEY_FILE = str(tmp_path / "vapid.pem")
    settings.TOLLGATE_VAPID_SUBJECT = "mailto:ops@example.com"
    settings.TOLLGATE_NOTIFY = True
    # The test's push service is on this machine: the address rules let it be reached.
    settings.TOLLGATE_WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]
    settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE = True
    running = PushService()
    yield running
    running.close()


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def subscribe(user, subscriber) -> int:
    answer = signed_in(user).post("/push/subscriptions/", json.dumps(subscriber.info),
                                  content_type="application/json",
                                  headers={"User-Agent": "Firefox on Android"})
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def deliver_outbox(run) -> None:
    for message in OutboxMessage.objects.filter(run=run, done_at=None):
        outbox.deliver(message.pk)


def test_a_waiting_gate_reaches_each_subscribed_browser_of_its_approvers(
        service, release_spec, people):
    phone, laptop = Subscriber(service, "bob-phone"), Subscriber(service, "bob-laptop")
    carols = Subscriber(service, "carol-phone")
    subscribe(people["bob"], phone)
    subscribe(people["bob"], laptop)
    subscribe(people["carol"], carols)
    subscribe(people["alice"], Subscriber(service, "alice-phone"))  # not an approver
    run = engine.open_run(release_spec, actor=people["alice"], title="Release 1.0").run
    work(run, "build")
    deliver_outbox(run)
    pushed = {path: body for path, _, body in service.received}
    assert set(pushed) == {"/push/bob-phone", "/push/bob-laptop", "/push/carol-phone"}
    gate = run.steps.get(key="qa")
    message = phone.read(pushed["/push/bob-phone"])
    url = message.pop("url")
    assert message == {"title": "QA sign-off waits on you",
                       "body": f"{run}: 0 of 2 approvals",
                       "tag": f"gate-{gate.pk}-1", "choices": True}
    assert decision_links(url) == [(people["bob"].pk, gate.pk, 1)]
    assert decision_links(carols.read(pushed["/push/carol-phone"])["url"]) == [
        (people["carol"].pk, gate.pk, 1)]
    headers = service.received[0][1]
    assert headers["content-encoding"] == "aes128gcm" and int(headers["ttl"]) > 0
    claims = vapid_claims(headers, push.public_key())
    assert claims["sub"] == "mailto:ops@example.com" and claims["aud"] == service.url


def test_a_reminder_and_an_escalation_are_pushed_too(service, people):
    from workflows.specs.storage import store_spec

    spec = store_spec({"name": "urgent", "steps": [{"key": "qa", "title": "QA", "approval": {
        "group": "qa", "timeout_seconds": 3600, "on_timeout": "escalate",
        "escalate_to": "managers", "remind_after_seconds": 60}}]})[0]
    dave = Subscriber(service, "dave")
    bob = Subscriber(service, "bob")
    subscribe(people["dave"], dave)
    subscribe(people["bob"], bob)
    run = engine.open_run(spec, actor=people["alice"]).run
    gate = run.steps.get(key="qa")
    deliver_outbox(run)
    past = timezone.now() - timedelta(seconds=1)
    Step.objects.filter(pk=gate.pk).update(remind_at=past)
    assert engine.remind_gate(gate.pk) is not None
    deliver_outbox(run)
    Step.objects.filter(pk=gate.pk).update(deadline_at=past)
    assert engine.expire_gate(gate.pk) is not None
    deliver_outbox(run)
    titles = [(path, (dave if "dave" in path else bob).read(body)["title"])
              for path, _, body in service.received]
    assert titles == [("/push/bob", "QA waits on you"), ("/push/bob", "QA still waits on you"),
                      ("/push/dave", "QA was escalated to you")]


def test_a_browser_the_push_service_says_is_gone_is_dropped(service, waiting, people):
    gone = Subscriber(service, "gone")
    subscribe(people["bob"], gone)
    service.status = 410
    checkpoint = Checkpoint.objects.filter(run=waiting).last()
    assert push.deliver(checkpoint.pk, [("gate_waiting", "qa")]) == 0
    assert not PushSubscription.objects.exists()


@pytest.mark.parametrize("info, why", [
    ("not json", "Not a push subscription"),
    ({"endpoint": "https://push.example.com/x"}, "send the browser's PushSubscription"),
    ({"endpoint": "http://10.0.0.7/x", "keys": {"p256dh": "a", "auth": "b"}}, "endpoint"),
    ({"endpoint": "https://push.example.com/x", "keys": {"p256dh": "AAAA", "auth": "AAAA"}},
     "keys.p256dh must be 65 bytes"),
])
def test_a_subscription_that_is_not_one_is_refused_and_nothing_kept(people, info, why,
                                                                     settings, tmp_path):
    settings.TOLLGATE_VAPID_KEY_FILE = str(tmp_path / "vapid.pem")
    body = info if isinstance(info, str) else json.dumps(info)
    answer = signed_in(people["bob"]).post("/push/subscriptions/", body,
                                           content_type="application/json")
    assert answer.status_code == 400 and why in answer.json()["detail"], answer.content
    assert not PushSubscription.objects.exists()


def test_without_a_vapid_key_there_is_no_push(people, settings):
    settings.TOLLGATE_VAPID_KEY_FILE = ""
    bob = signed_in(people["bob"])
    assert "Push notifications are not set up" in bob.get("/profile/").content.decode()
    assert bob.post("/push/subscriptions/", "{}", content_type="application/json"
                    ).status_code == 404


def test_the_profile_lists_a_persons_browsers_and_removes_one(service, people):
    first = subscribe(people["bob"], Subscriber(service, "one"))
    subscribe(people["carol"], Subscriber(service, "two"))
    bob = signed_in(people["bob"])
    page = bob.get("/profile/").content.decode()
    assert "Firefox on Android" in page and push.public_key() in page
    assert bob.post(f"/push/subscriptions/{first}/remove/").status_code == 302
    assert list(PushSubscription.objects.values_list("user__username", flat=True)) == ["carol"]


def test_the_notifications_approve_opens_the_page_with_the_choice_made_and_one_press_decides(
        waiting, people):
    gate = waiting.steps.get(key="qa")
    bob = signed_in(people["bob"])
    url = links.decision_url(people["bob"], gate).removeprefix("http://testserver")
    page = bob.get(f"{url}?via=push&choice=approve").content.decode()
    assert "You chose Approve in the notification" in page
    assert 'name="via" value="push"' in page and "autofocus" in page
    assert not Approval.objects.exists()  # opening it decided nothing
    digest = gate.evidence_digest
    answer = bob.post(f"/runs/{waiting.pk}/steps/qa/approve/",
                      {"via": "push", "evidence_digest": digest, "comment": ""})
    assert answer.status_code in (200, 302)
    assert list(Approval.objects.values_list("user__username", "channel")) == [("bob", "push")]


def test_the_app_is_installable_and_its_worker_controls_the_whole_site(client):
    manifest = client.get("/manifest.webmanifest")
    assert manifest["Content-Type"] == "application/manifest+json"
    body = manifest.json()
    assert body["display"] == "standalone" and body["start_url"] == "/"
    assert {icon["sizes"] for icon in body["icons"]} == {"192x192", "512x512"}
    for icon in body["icons"]:
        assert client.get(icon["src"]).status_code == 200
    worker = client.get("/sw.js")
    assert worker.status_code == 200 and worker["Service-Worker-Allowed"] == "/"
    assert worker["Content-Type"].startswith("text/javascript")
    assert "notificationclick" in worker.content.decode()


def test_a_push_goes_to_the_address_checked_whatever_the_name_resolves_to_after(
        service, settings, monkeypatch, people):
    """DNS rebinding gains nothing: the push service's name is resolved and checked once at
    send time, and the connection goes to that address (a second lookup answering another
    address, here one where nothing listens, is never asked)."""
    import socket

    port = int(service.url.rsplit(":", 1)[1])
    settings.TOLLGATE_WEBHOOK_HTTP_HOSTS = ["push.test"]
    phone = Subscriber(service, "bob-phone")
    phone.info["endpoint"] = f"http://push.test:{port}/push/bob-phone"
    subscription = PushSubscription.objects.get(pk=subscribe(people["bob"], phone))
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1"])  # the first lookup; any later one: nothing listens there

    def lookup(host, *args, **kwargs):
        if host != "push.test":
            return real(host, *args, **kwargs)
        return real(next(answers, "127.0.0.2"), *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert push.send(subscription, {"title": "QA sign-off waits on you"})
    (path, _, body), = service.received
    assert path == "/push/bob-phone" and phone.read(body)["title"] == "QA sign-off waits on you"

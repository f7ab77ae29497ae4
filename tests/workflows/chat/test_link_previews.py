"""No link decides by being opened: chat platforms, mail scanners and link-preview bots GET
every link they see (a peer's "send and wait" requests were approved by a preview bot that
opened their links). Every link a gate's mail, digest, push and chat messages carry is
fetched as such a bot would, without a session and with the approver's own, on Slack and on
Teams: nothing is decided, linked or changed; a decision is only ever a POST from a page the
person saw."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.test import Client

from tests.support.push import PushService, Subscriber
from workflows.delivery import digests, outbox, push
from workflows.models import (
    Approval,
    ChatIdentity,
    Checkpoint,
    Notification,
    OutboxMessage,
    Preference,
    Step,
)

from .test_contract import waiting

pytestmark = pytest.mark.django_db(transaction=True)

LINK = re.compile(r"https?://[^\s\"'<>)\]|\\\\]+")


def test_opening_every_link_a_channel_sends_decides_nothing(platform, people, settings,
                                                           tmp_path):
    settings.TOLLGATE_NOTIFY = True  # the gate's mail to its approvers too
    # bob's phone gets the push too, from a push service on this machine.
    settings.TOLLGATE_VAPID_KEY_FILE = str(tmp_path / "vapid.pem")
    settings.TOLLGATE_WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]
    settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE = True
    service = PushService()
    phone = Subscriber(service)
    push.subscribe(people["bob"], phone.info)
    run, gate = waiting(people, month="November")
    try:
        for message in OutboxMessage.objects.filter(run=run, done_at=None):
            outbox.deliver(message.pk)  # the mail, chat and push a waiting gate owes, sent
    finally:
        service.close()
    pushed = [phone.read(body)["url"] for _, _, body in service.received]
    assert pushed, "nothing was pushed"
    # As the service worker opens them: the page, and with the notification's choice made.
    pushed += [f"{url}?via=push&choice={choice}" for url in pushed
               for choice in ("approve", "reject")]
    platform.press(gate, "approve", "erin")  # someone chat cannot match: sent the link
    platform.handled()
    sent = [platform.shown(channel) for channel in platform.posted_channels()]
    sent += platform.told("erin") + platform.told("bob")
    # bob's daily digest too (its hour, midnight, has come; its "approve together" link, for
    # two plain gates or more, is opened in tests/workflows/delivery/test_digests.py).
    Preference.objects.update_or_create(user=people["bob"], defaults={"digest_hour": 0})
    assert digests.send_digests() == 1
    sent += list(Notification.objects.values_list("body", flat=True)) + pushed
    ours = urlsplit(settings.TOLLGATE_BASE_URL).netloc
    links = {url for text in sent for url in LINK.findall(text.replace("\\u0026", "&"))
             if urlsplit(url).netloc == ours}
    assert any("/decide/" in url for url in links), links  # the mailed decision link
    assert any(f"/runs/{run.pk}/" in url for url in links), links
    before = (Approval.objects.count(), ChatIdentity.objects.count(),
              Checkpoint.objects.filter(run=run).count())
    bob = Client()
    bob.force_login(people["bob"])
    for url in sorted(links):
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        for opener in (Client(), bob):  # a bot with no session, and with the person's
            answer = opener.get(path)
            assert answer.status_code < 500, (url, answer.status_code)
    after = (Approval.objects.count(), ChatIdentity.objects.count(),
             Checkpoint.objects.filter(run=run).count())
    assert after == before, (sorted(links), before, after)
    assert Step.objects.get(pk=gate.pk).status == "waiting_approval"

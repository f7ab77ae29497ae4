"""Replies through a hosted mail service's inbound webhook (django-anymail), over HTTP to the
app served by gunicorn as in production: only the service that knows the webhook's secret is
heard, and what it posts reaches the same handler as the mail server's pipe."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support import mail
from tests.support.processes import listener, start_gunicorn, stop
from tests.workflows.consumers import consumer_env
from workflows.delivery import links
from workflows.models import Approval, MailReply

DOMAIN = "reply.tollgate.example.org"


@pytest.mark.django_db(transaction=True)
def test_a_reply_posted_by_the_hosted_service_decides_and_a_stranger_is_not_heard(
        waiting, people, tmp_path, settings):
    settings.TOLLGATE_REPLY_DOMAIN = DOMAIN
    gate = waiting.steps.get(key="qa")
    address = links.reply_address(people["bob"], gate)
    raw = mail.reply(address, "Bob <bob@example.com>", "approve\nvia the hosted service")
    mail.publish(records := tmp_path / "dkim.json")
    env = consumer_env(TOLLGATE_ANYMAIL_WEBHOOK_SECRET="sendgrid:hook-secret",
                       TOLLGATE_REPLY_DOMAIN=DOMAIN, TOLLGATE_TEST_DKIM_RECORDS=str(records),
                       TOLLGATE_DKIM_DNS="tests.support.mail.dns_txt",
                       TOLLGATE_SSL_REDIRECT="0")
    sock = listener()
    web = start_gunicorn(env, sock, workers=1)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/anymail/sendgrid/inbound/"
    posted = {"email": raw.decode(),
              "envelope": json.dumps({"to": [address], "from": "bob@example.com"})}
    try:
        stranger = requests.post(url, data=posted, auth=("sendgrid", "guessed"), timeout=60)
        assert stranger.status_code in (400, 403), stranger.status_code
        assert not MailReply.objects.exists()
        heard = requests.post(url, data=posted, auth=("sendgrid", "hook-secret"), timeout=60)
        assert heard.status_code == 200, heard.text[:500]
    finally:
        stop(web)
        sock.close()
    row = Approval.objects.get(step=gate)
    assert (row.user, row.channel, row.comment) == (people["bob"], "mail_reply",
                                                    "via the hosted service")
    assert MailReply.objects.get().via == "anymail:sendgrid"

"""The daily digest: at the person's own hour in their own zone, one mail listing every gate
that waits on them with its essentials and its link, and a link that opens the inbox with
the plain ones ticked, for one press to approve them all; once a day, whatever the consumers."""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.core import mail
from django.db import connection
from django.test import Client

from tests.conftest import make_user
from tests.support import mail as mails
from tests.workflows.test_concurrency import race
from workflows import engine
from workflows.delivery import digests
from workflows.models import Approval, Notification, Preference, StepStatus
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

TOKYO = ZoneInfo("Asia/Tokyo")


@pytest.fixture
def gates(release_spec, people):
    """Three gates waiting on qa (bob, carol): two plain, one that must be signed."""
    signed = store_spec({"name": "signed", "steps": [
        {"key": "qa", "title": "Signed sign-off", "approval": {
            "group": "qa", "signature": {"meaning": "I tested it"}}}]})[0]
    runs = []
    for title in ("Release 1.0", "Release 1.1"):
        run = engine.open_run(release_spec, actor=people["alice"], title=title).run
        engine.start_step(run, "build")
        engine.complete_step(run, "build")
        runs.append(run)
    runs.append(engine.open_run(signed, actor=people["alice"], title="Audit 7").run)
    return [run.steps.get(key="qa") for run in runs]


def digest_at(user, hour: int, zone: str = "Asia/Tokyo"):
    Preference.objects.update_or_create(user=user, defaults={"digest_hour": hour,
                                                             "time_zone": zone})


def tokyo(*args) -> datetime:
    return datetime(*args, tzinfo=TOKYO)


def test_the_digest_comes_at_the_persons_hour_in_their_zone_once_a_day(gates, people):
    digest_at(people["bob"], 9)
    assert digests.send_digests(now=tokyo(2026, 12, 8, 8, 59)) == 0
    assert digests.send_digests(now=tokyo(2026, 12, 8, 9, 0)) == 1
    assert digests.send_digests(now=tokyo(2026, 12, 8, 9, 1)) == 0
    assert digests.send_digests(now=tokyo(2026, 12, 8, 23, 59)) == 0
    # Missed at the hour (no consumer ran): it still comes that day.
    assert digests.send_digests(now=tokyo(2026, 12, 9, 14, 30)) == 1
    sent = [m for m in mail.outbox if "wait on you" in m.subject]
    assert [m.to for m in sent] == [["bob@example.com"]] * 2
    assert "(Tue 08 Dec)" in sent[0].subject and "3 gates wait on you" in sent[0].subject


def test_the_digest_lists_every_waiting_gate_with_its_link_and_the_plain_ones_together(
        gates, people):
    digest_at(people["bob"], 9)
    digests.send_digests(now=tokyo(2026, 12, 8, 9, 0))
    body = mail.outbox[-1].body
    for gate in gates:
        assert f"{gate.title} of run {gate.run}" in body
        assert (people["bob"].pk, gate.pk, gate.attempt) in mails.decision_links(body)
    assert "Decided on its page only: it must be signed" in body
    assert "Approve the 2 plain ones together" in body
    assert "Requested by alice" in body and "0 of 2 approvals" in body


def test_nothing_waiting_sends_nothing_and_no_digest_sends_nothing(gates, people):
    digest_at(people["erin"], 9)  # in no group: nothing waits on her
    assert digests.send_digests(now=tokyo(2026, 12, 8, 9, 0)) == 0
    assert digests.send_digests(now=tokyo(2026, 12, 8, 9, 5)) == 0
    assert not Notification.objects.filter(event="digest").exists()
    assert mail.outbox == []  # carol asked for none


def test_the_together_link_ticks_the_plain_gates_and_one_press_approves_them(gates, people):
    digest_at(people["bob"], 9)
    digests.send_digests(now=tokyo(2026, 12, 8, 9, 0))
    together = re.search(r"http://testserver(/\?digest=\S+)", mail.outbox[-1].body)[1]
    assert Client().get(together).status_code == 302  # a preview bot: to the sign-in page
    bob = Client()
    bob.force_login(people["bob"])
    page = bob.get(together).content.decode()
    assert "From your digest: 2 gates ticked below" in page
    ticked = set(map(int, re.findall(r'name="gate" value="(\d+)"[^>]*checked', page)))
    assert ticked == {gates[0].pk, gates[1].pk}
    assert Approval.objects.count() == 0  # opening it decided nothing
    seen = dict(re.findall(r'name="seen-(\d+)" value="(\w+)"', page))
    answer = bob.post("/inbox/decide/", {"gate": sorted(ticked), "decision": "approve",
                                         **{f"seen-{pk}": seen[str(pk)] for pk in ticked}})
    assert answer.status_code == 302
    assert sorted(Approval.objects.values_list("step_id", "user__username", "channel")) == [
        (gates[0].pk, "bob", "bulk"), (gates[1].pk, "bob", "bulk")]
    gates[2].refresh_from_db()
    assert gates[2].status == StepStatus.WAITING_APPROVAL


def test_a_digest_link_of_someone_else_ticks_nothing(gates, people):
    digest_at(people["bob"], 9)
    digests.send_digests(now=tokyo(2026, 12, 8, 9, 0))
    together = re.search(r"http://testserver(/\?digest=\S+)", mail.outbox[-1].body)[1]
    carol = Client()
    carol.force_login(people["carol"])
    page = carol.get(together).content.decode()
    assert "sent to someone else" in page and " checked" not in page.split('id="gate-list"')[1]


@pytest.mark.django_db(transaction=True)
def test_two_consumers_at_once_send_one_digest(gates, people):
    if connection.vendor != "postgresql":
        pytest.skip("two writers at once: PostgreSQL")
    digest_at(people["bob"], 9)
    counts = race(2, lambda i: digests.send_digests(now=tokyo(2026, 12, 8, 9, 0)))
    assert sorted(counts) == [0, 1]
    assert Notification.objects.filter(event="digest").count() == 1


def test_the_profile_sets_and_stops_the_digest(people):
    bob = Client()
    bob.force_login(people["bob"])
    assert bob.post("/profile/", {"digest_hour": "7"}).status_code == 302
    assert Preference.objects.get(user=people["bob"]).digest_hour == 7
    assert bob.post("/profile/", {"digest_hour": "25"}).status_code == 302
    assert Preference.objects.get(user=people["bob"]).digest_hour == 7
    bob.post("/profile/", {"digest_hour": ""})
    assert Preference.objects.get(user=people["bob"]).digest_hour is None


def test_a_person_without_a_mail_address_gets_no_digest(gates):
    nomail = make_user("nomail", "qa")
    type(nomail).objects.filter(pk=nomail.pk).update(email="")
    digest_at(nomail, 9)
    assert digests.send_digests(now=tokyo(2026, 12, 8, 9, 0)) == 0

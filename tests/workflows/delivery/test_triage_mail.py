"""A gate's mail lets a person triage without opening Tollgate: the deadline in their own
zone with its consequence, the instructions rendered, the params, the quorum and the signed
link, in a plain-text and an HTML part; the requester's "approved" mail names the values."""

from __future__ import annotations

import pytest
from django.core import mail

from tests.workflows.helpers import work
from workflows import engine
from workflows.delivery import outbox
from workflows.models import Channel, Preference
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

PAYROLL = {"name": "payroll", "params": [
    {"name": "month", "type": "string", "label": "Month"},
    {"name": "total", "type": "number"}],
    "steps": [
        {"key": "compute", "title": "Compute", "run": {"command": ["true"]}},
        {"key": "sign", "title": "Finance sign-off", "depends_on": ["compute"],
         "description": "Compare **{{ params.month }}** with last month's <b>ledger</b>.",
         "approval": {"group": "qa", "required": 2, "timeout_seconds": 7200,
                      "form": [{"name": "bank", "type": "choice",
                                "options": ["north", "south"], "required": True}]}},
        {"key": "pay", "title": "Pay", "depends_on": ["sign"], "run": {"command": ["true"]}},
    ]}


@pytest.fixture
def delivered(settings, monkeypatch):
    settings.TOLLGATE_NOTIFY = True
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", outbox.deliver)


def test_the_waiting_mail_holds_what_triage_needs(people, delivered,
                                                  django_capture_on_commit_callbacks):
    Preference.objects.create(user=people["bob"], time_zone="Asia/Tokyo")
    store_spec(PAYROLL)
    run = engine.open_run("payroll", actor=people["alice"], title="Payroll Nov",
                          params={"month": "November", "total": 1200}).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "compute", evidence={}, summary="computed")
    to_bob = next(m for m in mail.outbox if m.to == ["bob@example.com"])
    to_carol = next(m for m in mail.outbox if m.to == ["carol@example.com"])
    deadline = run.steps.get(key="sign").deadline_at
    from zoneinfo import ZoneInfo
    tokyo = deadline.astimezone(ZoneInfo("Asia/Tokyo"))
    assert f"{tokyo:%H:%M} JST" in to_bob.subject + to_bob.body
    assert "after that it rejects itself" in to_bob.body
    assert "Compare **November** with last month" in to_bob.body
    assert "Month: November" in to_bob.body and "Total: 1200" in to_bob.body
    assert "0 of 2 approvals" in to_bob.body
    link = next(w for w in to_bob.body.split() if "/decide/" in w)
    assert link not in to_carol.body
    html, kind = to_bob.alternatives[0]
    assert kind == "text/html"
    assert "<strong>November</strong>" in html  # the instructions rendered
    assert "<b>ledger</b>" not in html  # raw HTML in instructions is not passed on
    assert link in html and "after that it rejects itself" in html


def test_a_value_in_the_instructions_is_text_in_the_mail(people, delivered,
                                                        django_capture_on_commit_callbacks):
    store_spec(PAYROLL)
    run = engine.open_run("payroll", actor=people["alice"], params={
        "month": "[Nov](https://evil.example/pay) or https://evil.example", "total": 1}).run
    with django_capture_on_commit_callbacks(execute=True):
        work(run, "compute", evidence={}, summary="computed")
    to_bob = next(m for m in mail.outbox if m.to == ["bob@example.com"])
    html = to_bob.alternatives[0][0]
    assert "evil.example" in html and 'href="https://evil.example' not in html
    # The text part: a mail reader finds no address in it to make a link of.
    instructions = to_bob.body.split("Compare **")[1].split("**")[0]
    assert "https://evil.example" not in instructions
    assert instructions.replace("\u200b", "") == (
        "[Nov](https://evil.example/pay) or https://evil.example")


def test_the_approved_mail_names_the_values_chosen(people, delivered,
                                                   django_capture_on_commit_callbacks):
    store_spec(PAYROLL)
    run = engine.open_run("payroll", actor=people["alice"],
                          params={"month": "November", "total": 1200}).run
    work(run, "compute")
    engine.approve(run, "sign", user=people["bob"], values={"bank": "north"})
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        engine.approve(run, "sign", user=people["carol"], values={"bank": "south"},
                       channel=Channel.API)
    approved = next(m for m in mail.outbox if "approved" in m.subject)
    assert approved.to == ["alice@example.com"]
    assert "bank: south" in approved.body  # the later approver's choice stands
    assert "south" in approved.alternatives[0][0]

"""`workflows.testing`, used as a project's own tests would use it: a run driven to its gate
in-process, what it sends recorded (mail, Slack, Teams, push), and the clock moved so that
its reminder and its deadline come at once."""

from __future__ import annotations

import pytest

from workflows import engine, testing
from workflows.models import PushSubscription, StepStatus
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db

SPEC = {"name": "nightly", "steps": [
    {"key": "build", "run": {"callable": "workflows.callables.noop"}},
    {"key": "check", "depends_on": ["build"], "run": {"command": ["true"]}},
    {"key": "qa", "title": "QA sign-off", "depends_on": ["check"], "approval": {
        "group": "qa", "timeout_seconds": 86400, "remind_after_seconds": 3600}},
    {"key": "ship", "depends_on": ["qa"], "run": {"command": ["true"]}}]}


def test_a_run_goes_to_its_gate_sends_what_it_owes_and_its_deadline_passes(people):
    store_spec(SPEC)
    PushSubscription.objects.create(user=people["bob"], endpoint="https://push.example/1",
                                    p256dh="k", auth="a")
    with testing.moved_clock() as clock, testing.recorded_sends({"qa": "C-QA"}) as sent:
        run = engine.open_run("nightly", actor=people["alice"]).run
        gates = testing.run_to_next_gate(run)
        assert [gate.key for gate in gates] == ["qa"]
        assert {s.key: s.status for s in run.steps.all()}["check"] == StepStatus.COMPLETED
        testing.deliver_outbox()
        mailed = [m.subject for m in sent.mail_to("bob@example.com")]
        assert len(mailed) == 1 and mailed[0].startswith(
            "[Tollgate] QA sign-off waits on qa (due "), (mailed, sent)
        for platform in ("slack", "teams"):
            posted = sent.chat_on(platform)
            assert posted[0][:2] == ("post", "C-QA") and posted[0][2].title == "QA sign-off"
        assert [(user.username, payload["title"]) for user, payload in sent.push] == [
            ("bob", "QA sign-off waits on you")]

        clock.advance(hours=2)
        assert testing.run_due()["reminders"] == 1
        testing.deliver_outbox()
        assert any("Reminder" in m.subject for m in sent.mail_to("carol@example.com"))
        assert ("remind", "C-QA") in [(what, where) for what, where, _ in sent.chat_on("slack")]

        clock.advance(days=1)
        assert testing.run_due()["deadlines"] == 1
    run.refresh_from_db()
    assert run.status == "failed"
    assert run.steps.get(key="qa").status == StepStatus.FAILED


def test_approved_the_run_goes_on_to_its_end(people):
    store_spec(SPEC)
    run = engine.open_run("nightly", actor=people["alice"]).run
    testing.run_to_next_gate(run)
    engine.approve(run, "qa", user=people["bob"])
    assert testing.run_to_next_gate(run) == []
    run.refresh_from_db()
    assert run.status == "completed"

"""Reminders before a gate's deadline: at their times on the database clock, each one a
checkpoint that names who was told, mailed through the outbox, never at or after the
deadline and never once the gate is decided."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from workflows import engine
from workflows.delivery import outbox
from workflows.models import Checkpoint, Step
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec
from workflows.timing import clock, deadlines

pytestmark = pytest.mark.django_db


class Clock:
    """The database clock, moved by hand."""

    def __init__(self, monkeypatch):
        self.at = timezone.now().replace(microsecond=0)
        monkeypatch.setattr(clock, "now", lambda: self.at)
        monkeypatch.setattr(clock, "database_now", lambda: self.at)

    def advance_to(self, seconds: float):
        """Seconds after the gate started waiting (the clock's first reading)."""
        self.at = self.start + timedelta(seconds=seconds)


@pytest.fixture
def now(monkeypatch):
    moved = Clock(monkeypatch)
    moved.start = moved.at
    return moved


def gated(**approval):
    return store_spec({"name": "reminded", "steps": [
        {"key": "ok", "title": "Sign-off", "approval": {"group": "qa", **approval}}]})[0]


def reminders(run) -> list[tuple[int, str]]:
    return [(c.evidence["reminder"], c.at) for c in Checkpoint.objects.filter(
        run=run, kind="gate_reminded").order_by("seq")]


def remind_at(now, seconds) -> int:
    now.advance_to(seconds)
    return deadlines.remind()


def test_reminders_come_at_their_times_and_stop_before_the_deadline(now, people):
    run = engine.open_run(gated(timeout_seconds=3600, remind_after_seconds=600,
                                remind_every_seconds=900), actor=people["alice"]).run
    gate = Step.objects.get(run=run, key="ok")
    assert gate.remind_at == now.start + timedelta(seconds=600)
    assert remind_at(now, 599) == 0
    assert remind_at(now, 600) == 1
    assert remind_at(now, 601) == 0  # sent once
    assert remind_at(now, 1500) == 1
    assert remind_at(now, 2400) == 1
    assert remind_at(now, 3300) == 1
    # The next would fall at 4200 s, after the deadline at 3600 s: none is planned.
    assert Step.objects.get(pk=gate.pk).remind_at is None
    assert remind_at(now, 3599) == 0
    assert [n for n, _ in reminders(run)] == [1, 2, 3, 4]
    first = Checkpoint.objects.filter(run=run, kind="gate_reminded").first()
    assert first.actor_name == "reminder"
    assert sorted(first.evidence["told"]) == ["bob", "carol"]  # alice requested it
    assert first.summary == ("Reminder 1: Sign-off waits on qa (for 10 min); its deadline "
                             "is in 50 min")


def test_no_reminder_once_the_gate_is_decided(now, people):
    run = engine.open_run(gated(remind_after_seconds=600, remind_every_seconds=600),
                          actor=people["alice"]).run
    assert remind_at(now, 600) == 1
    now.advance_to(700)
    engine.approve(run, "ok", user=people["bob"])
    assert Step.objects.get(run=run, key="ok").remind_at is None
    assert remind_at(now, 1200) == 0 and remind_at(now, 10_000) == 0
    assert len(reminders(run)) == 1


def test_a_partial_quorum_keeps_reminding_those_still_to_decide(now, people):
    run = engine.open_run(gated(required=2, remind_after_seconds=600),
                          actor=people["alice"]).run
    engine.approve(run, "ok", user=people["bob"])
    assert remind_at(now, 600) == 1
    reminder = Checkpoint.objects.get(run=run, kind="gate_reminded")
    assert reminder.evidence["told"] == ["carol"]
    assert remind_at(now, 100_000) == 0  # no remind_every: one reminder only


def test_the_setting_reminds_gates_that_declare_none(now, people, settings):
    settings.TOLLGATE_REMIND_AFTER_SECONDS = 3600
    settings.TOLLGATE_REMIND_EVERY_SECONDS = 1800
    plain = engine.open_run(gated(), actor=people["alice"]).run
    own = engine.open_run(gated(remind_every_seconds=7200), actor=people["alice"]).run
    assert remind_at(now, 3600) == 1  # the plain gate, by the setting
    assert remind_at(now, 5400) == 1  # the plain gate again
    assert remind_at(now, 7200) == 2  # both: the declared gate's first is its every
    assert [n for n, _ in reminders(plain)] == [1, 2, 3] and len(reminders(own)) == 1


def test_an_escalated_gate_reminds_its_new_group(now, people):
    people["erin"].groups.add(*people["dave"].groups.all())
    run = engine.open_run(gated(timeout_seconds=900, on_timeout="escalate",
                                escalate_to="managers", remind_every_seconds=600),
                          actor=people["alice"]).run
    assert remind_at(now, 600) == 1
    now.advance_to(900)
    assert deadlines.apply() == 1
    assert remind_at(now, 1500) == 1
    last = Checkpoint.objects.filter(run=run, kind="gate_reminded").last()
    assert last.evidence["group"] == "managers"
    assert sorted(last.evidence["told"]) == ["dave", "erin"]


def test_reminders_are_mailed_to_whoever_can_decide(now, people, settings, monkeypatch,
                                                    django_capture_on_commit_callbacks):
    settings.TOLLGATE_NOTIFY = True
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", outbox.deliver)
    with django_capture_on_commit_callbacks(execute=True):
        engine.open_run(gated(timeout_seconds=7200, remind_after_seconds=3600),
                        actor=people["alice"])
    mail.outbox.clear()
    now.advance_to(3600)
    with django_capture_on_commit_callbacks(execute=True):
        assert deadlines.remind() == 1
    assert sorted(m.to[0].split("@")[0] for m in mail.outbox) == ["bob", "carol"]
    assert all(m.subject.startswith("[Tollgate] Reminder: Sign-off still waits on qa (due ")
               for m in mail.outbox)


@pytest.mark.parametrize("approval, problem", [
    ({"remind_after_seconds": 30}, "remind_after_seconds must be at least 60, got 30"),
    ({"remind_every_seconds": "often"}, "remind_every_seconds must be a number"),
    ({"remind_every_seconds": 0}, "remind_every_seconds must be greater than 0"),
])
def test_bad_reminders_are_refused_naming_the_step(approval, problem):
    with pytest.raises(SpecError) as refused:
        validate_spec({"name": "bad", "steps": [
            {"key": "ok", "approval": {"group": "qa", **approval}}]})
    assert "ok" in str(refused.value) and problem in str(refused.value)

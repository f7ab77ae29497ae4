"""Approval deadlines: reject or escalate through the engine, with a checkpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workflows import engine
from workflows.models import Checkpoint, Step
from workflows.specs.storage import store_spec
from workflows.timing import deadlines

from .helpers import status

pytestmark = pytest.mark.django_db


def gated(on_timeout="reject", **extra):
    approval = {"group": "qa", "timeout_seconds": 3600, "on_timeout": on_timeout, **extra}
    return store_spec({"name": f"gate-{on_timeout}", "steps": [
        {"key": "ok", "approval": approval},
        {"key": "after", "depends_on": ["ok"], "run": {"command": ["true"]}}]})[0]


def overdue(run):
    Step.objects.filter(run=run, key="ok").update(deadline_at=timezone.now()
                                                  - timedelta(seconds=1))


def test_gate_gets_a_deadline_when_it_starts_waiting(db):
    run = engine.open_run(gated()).run
    gate = Step.objects.get(run=run, key="ok")
    assert gate.deadline_at - gate.waiting_since == timedelta(hours=1)


def test_overdue_gate_is_rejected(db):
    run = engine.open_run(gated()).run
    assert deadlines.apply() == 0
    overdue(run)
    assert deadlines.apply() == 1
    assert status(run) == {"run": "failed", "ok": "failed", "after": "pending"}
    checkpoint = Checkpoint.objects.filter(run=run).last()
    assert checkpoint.kind == "gate_timed_out" and checkpoint.actor_name == "deadline"
    assert checkpoint.summary == "No decision from qa after 1 h"  # the time it was given
    assert deadlines.apply() == 0  # applied once


def test_overdue_gate_escalates_once(db, people):
    people["erin"].groups.add(*people["dave"].groups.all())  # erin joins managers
    run = engine.open_run(gated("escalate", escalate_to="managers")).run
    overdue(run)
    assert deadlines.apply() == 1
    gate = Step.objects.get(run=run, key="ok")
    assert gate.status == "waiting_approval" and gate.approval_group == "managers"
    assert gate.deadline_at is None and gate.escalated_at is not None
    assert Checkpoint.objects.filter(run=run).last().kind == "gate_escalated"
    with pytest.raises(engine.NotPermitted):
        engine.approve(run, "ok", user=people["bob"])  # qa no longer decides it
    engine.approve(run, "ok", user=people["erin"])
    assert status(run)["ok"] == "completed"


def test_decided_gate_is_not_expired(db, people):
    run = engine.open_run(gated()).run
    engine.approve(run, "ok", user=people["bob"])
    assert Step.objects.get(run=run, key="ok").deadline_at is None
    assert deadlines.apply(now=timezone.now() + timedelta(days=2)) == 0


def test_retry_after_timeout_restores_group_and_deadline(db, people):
    run = engine.open_run(gated("escalate", escalate_to="managers")).run
    overdue(run)
    deadlines.apply()
    engine.reject(run, "ok", user=people["dave"], comment="not now")
    engine.retry_step(run, "ok")
    gate = Step.objects.get(run=run, key="ok")
    assert gate.approval_group == "qa" and gate.deadline_at is not None


@pytest.mark.parametrize("entry", ["engine", "web", "htmx", "api", "bulk"])
def test_a_decision_after_the_deadline_is_refused_before_the_deadline_task_runs(
        db, people, entry):
    """The deadline passed a second ago and no deadline task has run: a decision now is
    refused on every channel, and the gate is left for the deadline to end."""
    from django.test import Client

    from workflows.models import ApiToken, Approval

    run = engine.open_run(gated(), actor=people["alice"]).run
    overdue(run)
    gate = Step.objects.get(run=run, key="ok")
    if entry == "engine":
        with pytest.raises(engine.IllegalTransition, match="deadline passed"):
            engine.approve(run, "ok", user=people["bob"])
    elif entry == "bulk":
        decided, refused = engine.decide_many([gate.pk], user=people["bob"],
                                              decision="approve")
        assert decided == [] and "deadline passed" in refused[gate.pk]
    elif entry == "api":
        token = ApiToken.objects.issue(people["bob"])[1]
        response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
            f"/api/runs/{run.pk}/steps/ok/approve", {}, content_type="application/json")
        assert response.status_code == 409 and "deadline passed" in response.json()["error"]
    else:
        client = Client(**({"HTTP_HX_REQUEST": "true"} if entry == "htmx" else {}))
        client.force_login(people["bob"])
        response = client.post(f"/runs/{run.pk}/steps/ok/approve/", {"comment": "late"})
        assert response.status_code == 409 and "deadline passed" in response.content.decode()
    assert not Approval.objects.filter(step=gate).exists()
    assert deadlines.apply() == 1 and status(run)["ok"] == "failed"


def test_a_late_decision_is_told_as_the_card_tells_the_deadline(db, people):
    """Its title, the card's time in the reader's zone, and what the card says follows."""
    from django.test import Client

    run = engine.open_run(gated("escalate", escalate_to="managers"), actor=people["alice"]).run
    overdue(run)
    gate = Step.objects.get(run=run, key="ok")
    Step.objects.filter(pk=gate.pk).update(title="Finance sign-off")
    client = Client()
    client.force_login(people["bob"])
    page = client.post(f"/runs/{run.pk}/steps/ok/approve/", {"comment": "late"})
    at = timezone.localtime(gate.deadline_at)
    when = f"{at:%a} {at.day} {at:%b %H:%M %Z}"
    said = page.content.decode()
    assert (f"Cannot approve Finance sign-off: its deadline passed at {when}, and it "
            "escalates to managers now.") in said
    assert f">{when}</time>" in said and "escalates to managers" in said  # the card's own

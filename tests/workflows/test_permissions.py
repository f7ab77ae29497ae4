"""The gate rule in its three forms (predicate, inbox queryset, notification audience) agrees."""

from __future__ import annotations

import itertools

import pytest

from workflows import engine
from workflows.models import Step
from workflows.people import permissions
from workflows.reads import selectors
from workflows.specs.storage import store_spec

from ..conftest import make_user

pytestmark = pytest.mark.django_db

SPEC = {"name": "two-gates", "steps": [
    {"key": "qa", "approval": {"group": "qa", "required": 2}},
    {"key": "own", "approval": {"group": "release", "allow_self_approval": True}},
    {"key": "later", "depends_on": ["qa"], "approval": {"group": "qa"}},
]}


def test_predicate_inbox_and_audience_agree():
    spec = store_spec(SPEC)[0]
    users = [
        make_user("bob", "qa", perms=("add_run",)),
        make_user("carol", "qa", "release", perms=("add_run",)),
        make_user("rel", "release"),
        make_user("erin"),
        make_user("gone", "qa", is_active=False),
        make_user("root", is_superuser=True),
    ]
    runs = []
    for requester in users[:2]:
        runs.append(engine.open_run(spec, actor=requester).run)
    engine.approve(runs[0], "qa", user=users[1])  # carol decided one attempt already
    finished = engine.open_run(spec, actor=users[0]).run
    engine.cancel_run(finished)
    gates = list(Step.objects.filter(kind="approval").select_related("run"))
    assert len(gates) == 9
    checked = 0
    for user, gate in itertools.product(users, gates):
        decided = gate.approvals.filter(attempt=gate.attempt, user=user).exists()
        may = permissions.decide_refusal(user, gate.run, gate) is None and not decided
        in_inbox = permissions.decidable_by(user).filter(pk=gate.pk).exists()
        in_audience = permissions.deciders(gate.run, gate).filter(pk=user.pk).exists()
        assert may == in_inbox == in_audience, (user.username, gate.run_id, gate.key)
        checked += may
    assert checked >= 4  # the rule lets some through, so agreement is not all-False
    for user in users:  # the header's count is the inbox's, compiled once
        assert selectors.inbox_count(user) == permissions.decidable_by(user).count(), user


RULES_SPEC = {"name": "policy", "params": [{"name": "amount", "type": "number"}], "steps": [
    {"key": "pay", "approval": {"rules": [
        {"group": "leads", "label": "lead"},
        {"group": "finance", "when": {"params": "amount", "gte": 1000}, "label": "finance"},
        {"manager": True, "group": "leads", "label": "manager", "order": 1},
    ]}},
]}


def test_the_three_forms_agree_on_rules_stages_delegates_and_reassigned_gates():
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import Preference

    spec = store_spec(RULES_SPEC)[0]
    users = [make_user("lead", "leads", perms=("add_run",)), make_user("lead2", "leads"),
             make_user("fin", "finance"), make_user("both", "leads", "finance"),
             make_user("boss"), make_user("dee", perms=("add_run",)),
             make_user("ops", perms=("operate_run",)),
             make_user("nobody")]
    by = {user.username: user for user in users}
    now = timezone.now()
    Preference.objects.create(user=by["lead"], manager=by["boss"])
    Preference.objects.create(user=by["fin"], delegate=by["dee"],
                              away_from=now - timedelta(hours=1),
                              away_until=now + timedelta(hours=5))
    Preference.objects.create(user=by["lead2"], delegate=by["lead"],
                              away_from=now - timedelta(hours=1),
                              away_until=now + timedelta(hours=5))
    for amount in (5000, 5):  # finance asked, and not
        engine.open_run(spec, actor=by["lead"], params={"amount": amount})
    staged = engine.open_run(spec, actor=by["lead"], params={"amount": 5}).run
    engine.approve(staged, "pay", user=by["lead2"])  # the lead stage met: the manager's opens
    half = engine.open_run(spec, actor=by["dee"], params={"amount": 5000}).run
    engine.approve(half, "pay", user=by["both"])
    moved = engine.open_run(spec, actor=by["lead"], params={"amount": 5}).run
    engine.reassign_gate(moved, "pay", actor=by["ops"], person=by["nobody"], reason="r")
    gates = list(Step.objects.filter(kind="approval").select_related("run"))
    checked = 0
    for user, gate in itertools.product(users, gates):
        may = permissions.decide_refusal(user, gate.run, gate) is None
        in_inbox = permissions.decidable_by(user).filter(pk=gate.pk).exists()
        in_audience = permissions.deciders(gate.run, gate).filter(pk=user.pk).exists()
        assert may == in_inbox == in_audience, (user.username, gate.run_id, may, in_inbox,
                                                in_audience)
        checked += may
    assert checked >= 8
    for user in users:
        assert selectors.inbox_count(user) == permissions.decidable_by(user).count(), user


def test_engine_answers_as_the_predicate(release_spec, people):
    run = engine.open_run(release_spec, actor=people["bob"]).run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    gate = run.steps.get(key="qa")
    for name, user in people.items():
        run.refresh_from_db()
        refusal = permissions.decide_refusal(user, run, gate)
        if refusal:
            with pytest.raises(engine.NotPermitted) as raised:
                engine.approve(run, "qa", user=user)
            assert str(raised.value) == refusal, name
        else:
            engine.approve(run, "qa", user=user)

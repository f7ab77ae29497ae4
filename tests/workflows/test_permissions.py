"""The gate rule in its three forms (predicate, inbox queryset, notification audience) agrees."""

from __future__ import annotations

import itertools

import pytest

from workflows import engine, permissions, selectors
from workflows.models import Step
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
        assert permissions.can_decide(user, gate.run, gate,
                                      {gate.pk} if decided else set()) == may
        checked += may
    assert checked >= 4  # the rule lets some through, so agreement is not all-False
    for user in users:  # the header's count is the inbox's, compiled once
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

"""Races with real threads and real transactions (run on SQLite and on PostgreSQL in CI)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from workflows import engine
from workflows.models import Approval, Checkpoint, Run

pytestmark = pytest.mark.django_db(transaction=True)


def race(n: int, fn):
    """Call fn(i) from n threads released at once; return results or exceptions."""
    barrier = threading.Barrier(n)

    def call(i):
        try:
            barrier.wait()
            return fn(i)
        except Exception as exc:  # collected, asserted on by the test
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def test_concurrent_open_run_with_one_key_yields_one_run(release_spec):
    results = race(8, lambda i: engine.open_run("release", idempotency_key="deploy-42"))
    assert all(isinstance(r, engine.Opened) for r in results), results
    assert Run.objects.count() == 1
    assert {r.run.pk for r in results} == {Run.objects.get().pk}
    assert sum(not r.reused for r in results) == 1


def test_concurrent_approvals_count_each_approver_once(release_spec, people):
    run = engine.open_run(release_spec, actor=people["alice"]).run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    approvers = [people["bob"], people["carol"]] * 3  # each clicks three times at once
    results = race(len(approvers), lambda i: engine.approve(run, "qa", user=approvers[i]))
    wins = [r for r in results if isinstance(r, Checkpoint)]
    assert len(wins) == 2
    assert all(isinstance(r, engine.IllegalTransition) for r in results if r not in wins)
    assert Approval.objects.filter(step__run=run).count() == 2
    assert run.steps.get(key="qa").status == "completed"
    assert Checkpoint.objects.filter(run=run, kind="step_approved").count() == 1
    seqs = list(Checkpoint.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_concurrent_decisions_on_rules_and_for_a_delegate_count_each_person_once(db):
    """Two rules and a delegate: everyone clicks at once, several times; each person counts
    once, toward one rule, and the delegate's decision for the person away is that
    person's only one."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import GateRule, Preference
    from workflows.specs.storage import store_spec

    from ..conftest import make_user

    spec = store_spec({"name": "dual", "steps": [{"key": "g", "approval": {"rules": [
        {"group": "leads", "required": 2}, {"group": "finance"}]}}]})[0]
    lee, lou, fin = make_user("lee", "leads"), make_user("lou", "leads"), make_user(
        "fin", "finance")
    dee = make_user("dee")
    now = timezone.now()
    Preference.objects.create(user=lou, delegate=dee, away_from=now - timedelta(hours=1),
                              away_until=now + timedelta(hours=1))
    run = engine.open_run(spec).run
    clickers = [lee, lou, dee, fin] * 3
    results = race(len(clickers), lambda i: engine.approve(run, "g", user=clickers[i]))
    wins = [r for r in results if isinstance(r, Checkpoint)]
    # lee, fin, and one of lou or dee (for lou): three people, three decisions.
    assert len(wins) == 3, results
    assert all(isinstance(r, engine.WorkflowError) for r in results if r not in wins)
    decisions = list(Approval.objects.filter(step__run=run).values_list(
        "user__username", "on_behalf_of__username"))
    counted_as = sorted(for_user or user for user, for_user in decisions)
    assert counted_as == ["fin", "lee", "lou"]
    assert run.steps.get(key="g").status == "completed"
    assert sorted(GateRule.objects.filter(step__run=run).values_list("approvals", flat=True)) \
        == [1, 2]
    assert Checkpoint.objects.filter(run=run, kind="step_approved").count() == 1


def test_concurrent_claims_start_a_step_once(release_spec):
    run = engine.open_run(release_spec).run
    results = race(6, lambda i: engine.start_step(run, "build", owner=f"w{i}", lease_seconds=30))
    started = [r for r in results if not isinstance(r, Exception)]
    assert len(started) == 1
    assert run.steps.get(key="build").attempt == 1
    assert Checkpoint.objects.filter(run=run, kind="step_started").count() == 1


def test_concurrent_cancels_write_one_checkpoint(release_spec):
    run = engine.open_run(release_spec).run
    race(5, lambda i: engine.cancel_run(run, reason=f"click {i}"))
    assert Checkpoint.objects.filter(run=run, kind="run_cancelled").count() == 1


def test_runs_finishing_while_tallies_fold_count_once_each(release_spec):
    from goals.models import Goal
    from goals.rollup import fold_tallies, rollup
    from workflows.models import GoalTally

    root = Goal.objects.create(title="Root")
    goals = [Goal.objects.create(title=f"Team {i}", parent=root) for i in range(2)]

    def finish_runs_and_fold(i):
        for k in range(4):
            run = engine.open_run(release_spec, goal=goals[(i + k) % 2]).run
            engine.start_step(run, "build")
            engine.fail_step(run, "build", retryable=False)
            fold_tallies()

    results = race(6, finish_runs_and_fold)
    assert results == [None] * 6, results
    fold_tallies()
    assert not GoalTally.objects.filter(folded=False).exists()
    assert sorted(GoalTally.objects.values_list("goal_id", "runs_failed", "steps_total")) == [
        (goals[0].pk, 12, 48), (goals[1].pk, 12, 48)]
    total = rollup(root.pk)
    assert (total.runs_failed, total.runs_open, total.steps_total) == (24, 0, 96)


def test_a_goal_made_while_its_parent_moves_is_linked_under_the_new_place(monkeypatch):
    """A goal is made under M (its transaction still open, its links written from M's
    ancestors) while another transaction moves M under another root: the move waits for the
    tree's turn, so it sees the new goal and links it too; the closure stays the parent
    column's."""
    from goals import tree
    from goals.models import Goal, GoalLink
    from goals.services import goal_update
    from tests.goals.test_goals import closure_from_parents

    roots = [Goal.objects.create(title=f"Root {i}") for i in range(2)]
    middle = Goal.objects.create(title="Middle", parent=roots[0])
    linked, go = threading.Event(), threading.Event()
    link = tree.link

    def link_then_hold(goal_id, parent_id):
        link(goal_id, parent_id)
        if parent_id == middle.pk:
            linked.set()
            go.wait(30)  # the transaction stays open while the move is tried

    monkeypatch.setattr(tree, "link", link_then_hold)

    def make():
        try:
            Goal.objects.create(title="Leaf", parent=middle)
        finally:
            connection.close()

    def move():
        try:
            goal_update(middle, parent=roots[1])
        finally:
            connection.close()

    maker = threading.Thread(target=make)
    maker.start()
    assert linked.wait(30)
    mover = threading.Thread(target=move)
    mover.start()
    mover.join(2)  # without the tree's turn, the move would be done by now
    go.set()
    maker.join(30)
    mover.join(30)
    leaf = Goal.objects.get(title="Leaf")
    assert Goal.objects.get(pk=middle.pk).parent_id == roots[1].pk
    assert set(GoalLink.objects.values_list("ancestor_id", "descendant_id", "depth")) == \
        closure_from_parents()
    assert tree.ancestor_ids(leaf.pk) == [leaf.pk, middle.pk, roots[1].pk]


def test_two_authors_loading_a_new_name_at_once_leave_it_one_owner(db):
    """Each of six authors loads their own spec under one new name at the same moment: the
    name goes to exactly one of them, whose spec is the one stored; the others are refused."""
    from tests.conftest import make_user
    from workflows.errors import NotPermitted
    from workflows.models import SpecOwner, WorkflowSpec
    from workflows.specs.storage import store_spec

    authors = [make_user(f"author{i}", perms=("add_workflowspec",)) for i in range(6)]
    results = race(len(authors), lambda i: store_spec(
        {"name": "contested", "description": f"by {i}",
         "steps": [{"key": "w", "title": f"Wait {i}"}]}, actor=authors[i]))
    stored = [r for r in results if isinstance(r, tuple)]
    refused = [r for r in results if isinstance(r, NotPermitted)]
    assert len(stored) + len(refused) == len(authors), results
    owner = SpecOwner.objects.get(name="contested").user
    assert {spec.pk for spec, _ in stored} <= set(
        WorkflowSpec.objects.filter(name="contested").values_list("pk", flat=True))
    assert all(spec.description == f"by {authors.index(owner)}" for spec, _ in stored)

"""The goal hierarchy: cycles refused, closing and blocking bookkeeping, rollups."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from goals.models import Goal
from goals.rollup import family_rollups, rollup, rollups
from goals.services import goal_set_status, goal_update
from goals.tree import ancestor_ids
from workflows import engine

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree():
    root = Goal.objects.create(title="Root")
    child = Goal.objects.create(title="Child", parent=root)
    grandchild = Goal.objects.create(title="Grandchild", parent=child)
    return root, child, grandchild


def test_ancestors_nearest_first(tree):
    root, child, grandchild = tree
    assert ancestor_ids(grandchild.pk) == [grandchild.pk, child.pk, root.pk]


def closure_from_parents() -> set[tuple[int, int, int]]:
    """(ancestor, goal, depth) of every goal, walked from the parent column in Python."""
    parents = dict(Goal.objects.values_list("pk", "parent_id"))
    links = set()
    for pk in parents:
        above, depth = pk, 0
        while above is not None:
            links.add((above, pk, depth))
            above, depth = parents[above], depth + 1
    return links


def test_the_closure_follows_every_move(tree):
    """The closure is the parent column's, after creates and moves of whole subtrees (by
    the services, as the admin and the API move goals)."""
    from goals.models import GoalLink

    root, child, grandchild = tree
    other = Goal.objects.create(title="Other")
    leaf = Goal.objects.create(title="Leaf", parent=grandchild)

    def links():
        return set(GoalLink.objects.values_list("ancestor_id", "descendant_id", "depth"))

    assert links() == closure_from_parents()
    goal_update(child, parent=other)  # child's subtree, three deep, moves
    assert links() == closure_from_parents()
    assert ancestor_ids(leaf.pk) == [leaf.pk, grandchild.pk, child.pk, other.pk]
    goal_update(child, parent=None)
    assert links() == closure_from_parents()
    assert rollup(root.pk).descendants == 0 and rollup(child.pk).descendants == 2
    leaf.delete()
    assert links() == closure_from_parents()


def test_cycle_is_refused_with_clear_error(tree):
    root, _, grandchild = tree
    with pytest.raises(ValidationError) as error:
        goal_update(root, parent=grandchild)
    assert "cannot be its own ancestor" in str(error.value)
    root.refresh_from_db()
    assert root.parent is None


def test_own_parent_is_refused_by_the_database(tree):
    root = tree[0]
    with pytest.raises(IntegrityError), transaction.atomic():
        Goal.objects.filter(pk=root.pk).update(parent=root.pk)


def test_closing_sets_closed_at_and_reopening_clears_it(tree):
    goal = tree[1]
    goal_set_status(goal, "completed")
    goal.refresh_from_db()
    assert goal.closed_at is not None
    goal_set_status(goal, "active")
    goal.refresh_from_db()
    assert goal.closed_at is None


def test_blocked_needs_reason_and_unblocking_clears_it(tree):
    goal = tree[1]
    with pytest.raises(ValidationError, match="blocker reason"):
        goal_set_status(goal, "blocked")
    goal_set_status(goal, "blocked", blocker_reason="Waiting on legal")
    goal.refresh_from_db()
    assert goal.blocker_reason == "Waiting on legal"
    goal_set_status(goal, "active")
    goal.refresh_from_db()
    assert goal.blocker_reason == ""


def test_blocker_rule_is_in_the_database(tree):
    with pytest.raises(IntegrityError), transaction.atomic():
        Goal.objects.filter(pk=tree[0].pk).update(status="blocked")


def test_rollup_counts_the_whole_subtree(tree, release_spec, people):
    root, child, grandchild = tree
    engine.open_run(release_spec, goal=child)
    failed = engine.open_run(release_spec, goal=grandchild).run
    engine.start_step(failed, "build")
    engine.fail_step(failed, "build", retryable=False)
    waiting = engine.open_run(release_spec, goal=grandchild).run
    engine.start_step(waiting, "build")
    engine.complete_step(waiting, "build")
    result = rollup(root.pk)
    assert (result.children, result.descendants) == (1, 2)
    assert (result.runs_open, result.runs_completed, result.runs_failed) == (2, 0, 1)
    assert result.gates_waiting == 1 and result.oldest_gate_since is not None
    assert (result.steps_total, result.steps_done) == (12, 1)
    assert rollup(grandchild.pk).runs_open == 1


def test_finished_runs_reach_the_rollup_through_tallies_folded_or_not(tree, release_spec):
    from goals.rollup import fold_tallies
    from workflows.models import GoalTally

    root, child, _ = tree
    for _ in range(3):
        run = engine.open_run(release_spec, goal=child).run
        engine.start_step(run, "build")
        engine.fail_step(run, "build", retryable=False)
    engine.cancel_run(engine.open_run(release_spec, goal=child).run)
    before = rollup(root.pk)
    assert (before.runs_open, before.runs_failed, before.steps_total) == (0, 3, 12)
    assert GoalTally.objects.filter(goal=child, folded=False).count() == 3
    assert fold_tallies() == 3
    assert list(GoalTally.objects.filter(goal=child).values_list(
        "folded", "runs_failed", "steps_total")) == [(True, 3, 12)]
    assert rollup(root.pk) == before
    # A failed run retried is open again: its tally is taken back, then folded in.
    engine.retry_step(run, "build")
    retried = rollup(root.pk)
    assert (retried.runs_open, retried.runs_failed, retried.steps_total) == (1, 2, 12)
    assert fold_tallies() == 1
    assert rollup(root.pk) == retried
    assert GoalTally.objects.get(goal=child).runs_failed == 2


def test_rollups_take_one_query_for_any_number_of_goals(tree, django_assert_num_queries):
    root = tree[0]
    for i in range(30):
        Goal.objects.create(title=f"Leaf {i}", parent=root)
    ids = list(Goal.objects.values_list("pk", flat=True))
    with django_assert_num_queries(1):
        result = rollups(ids)
    assert result[root.pk].descendants == 32 and result[root.pk].children == 31


def test_a_goal_and_its_children_roll_up_as_their_subtrees_do(tree, release_spec, people):
    root, child, grandchild = tree
    sibling = Goal.objects.create(title="Sibling", parent=root)
    engine.open_run(release_spec, goal=root)  # the goal's own run counts too
    engine.open_run(release_spec, goal=sibling)
    waiting = engine.open_run(release_spec, goal=grandchild).run
    engine.start_step(waiting, "build")
    engine.complete_step(waiting, "build")
    failed = engine.open_run(release_spec, goal=child).run
    engine.start_step(failed, "build")
    engine.fail_step(failed, "build", retryable=False)
    family = family_rollups(root.pk, [child.pk, sibling.pk])
    assert family == rollups([root.pk, child.pk, sibling.pk])
    assert family[root.pk].runs_open == 3 and family[root.pk].descendants == 3

"""Steps added to a running run meet the rules of a spec that contains them."""

from __future__ import annotations

import pytest
from django.test import Client

from workflows import engine
from workflows.models import ApiToken, Run, Step
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError

from ..conftest import make_user

pytestmark = pytest.mark.django_db

NOOP = {"callable": "workflows.callables.noop"}


@pytest.fixture
def plain(db):
    return store_spec({"name": "plain", "steps": [{"key": "draft", "run": NOOP}]})[0]


@pytest.fixture
def rita(db):
    """A user who may only start runs."""
    return make_user("rita", "qa", perms=("add_run",))


def api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.objects.issue(user, 't')[1]}")


def add(user, run, *steps):
    return api(user).post(f"/api/runs/{run.pk}/steps", {"steps": list(steps)},
                          content_type="application/json")


PROGRAM_STEPS = {
    "shell": {"key": "x", "run": {"shell": "id; cat var/secret_key | rev"}},
    "command": {"key": "x", "run": {"command": ["id"]}},
    "compensation": {"key": "x", "run": NOOP, "compensation": {"shell": "id"}},
}


@pytest.mark.parametrize("kind", sorted(PROGRAM_STEPS))
def test_a_requester_without_author_command_spec_cannot_add_a_program(plain, rita, kind):
    run = engine.open_run(plain, actor=rita).run
    response = add(rita, run, PROGRAM_STEPS[kind])
    assert response.status_code == 403, response.content
    assert "author_command_spec" in response.json()["error"]
    assert not Step.objects.filter(run=run, key="x").exists()
    assert Run.objects.get(pk=run.pk).checkpoint_seq == 1


@pytest.mark.parametrize("kind", sorted(PROGRAM_STEPS))
def test_the_engine_refuses_it_whoever_calls(plain, rita, kind):
    run = engine.open_run(plain, actor=rita).run
    with pytest.raises(engine.NotPermitted, match="author_command_spec"):
        engine.add_steps(run, [PROGRAM_STEPS[kind]], actor=rita)


def test_an_author_of_commands_may_add_one_to_her_run(plain):
    ada = make_user("ada", perms=("add_run", "author_command_spec"))
    run = engine.open_run(plain, actor=ada).run
    assert add(ada, run, PROGRAM_STEPS["command"]).status_code == 201
    assert Step.objects.get(run=run, key="x").added_by == "ada"


def test_a_requester_adds_callables_and_wait_steps(plain, rita):
    run = engine.open_run(plain, actor=rita).run
    response = add(rita, run, {"key": "more", "run": NOOP}, {"key": "agent"})
    assert response.status_code == 201
    assert set(Step.objects.filter(run=run).values_list("key", flat=True)) == {
        "draft", "more", "agent"}


def test_only_an_operator_adds_a_gate(plain, rita):
    run = engine.open_run(plain, actor=rita).run
    gate = {"key": "ok", "depends_on": ["draft"], "approval": {"group": "qa"}}
    refused = add(rita, run, gate)
    assert refused.status_code == 403 and "operator" in refused.json()["error"]
    olga = make_user("olga", perms=("operate_run",))
    assert add(olga, run, gate).status_code == 201


def test_an_added_gate_never_allows_self_approval(plain, rita):
    olga = make_user("olga", "qa", perms=("operate_run", "add_run"))
    run = engine.open_run(plain, actor=olga).run
    response = add(olga, run, {"key": "ok", "approval": {"group": "qa",
                                                         "allow_self_approval": True}})
    assert response.status_code == 400
    assert "cannot allow self-approval" in response.json()["error"]
    assert not Step.objects.filter(run=run, key="ok").exists()
    # Nor can the requester pass a gate an operator added to her run.
    mine = engine.open_run(plain, actor=rita).run
    engine.add_steps(mine, [{"key": "ok", "approval": {"group": "qa"}}], actor=olga)
    with pytest.raises(engine.NotPermitted, match="cannot decide"):
        engine.approve(mine, "ok", user=rita)


def test_a_gate_with_when_is_refused_at_load_and_when_added(plain):
    gate = {"key": "ok", "approval": {"group": "qa"}, "when": {"state": "x", "equals": 1}}
    with pytest.raises(SpecError, match="step 'ok': a gate cannot have when"):
        store_spec({"name": "branchy", "steps": [gate]})
    run = engine.open_run(plain).run
    with pytest.raises(engine.InvalidInput, match="step 'ok': a gate cannot have when"):
        engine.add_steps(run, [gate])


def test_a_run_holds_at_most_the_cap_of_steps(plain, settings):
    settings.TOLLGATE_MAX_STEPS_PER_RUN = 3
    run = engine.open_run(plain).run
    engine.add_steps(run, [{"key": "a", "run": NOOP}, {"key": "b", "run": NOOP}])
    with pytest.raises(engine.InvalidInput, match="cap of 3"):
        engine.add_steps(run, [{"key": "c", "run": NOOP}])
    assert Step.objects.filter(run=run).count() == 3
    with pytest.raises(SpecError, match="at most 3"):
        store_spec({"name": "big", "steps": [{"key": f"s{i}", "run": NOOP} for i in range(4)]})


def test_the_run_page_orders_a_long_grown_chain_by_dependency(
        plain, client, django_assert_max_num_queries):
    """Steps added in batches, each depending on the one before: the page lists them in
    chain order, in the same number of queries as a short run."""
    run = engine.open_run(plain).run
    previous = "draft"
    for batch in range(5):
        items = []
        for i in range(40):
            key = f"s{batch}-{i}"
            items.append({"key": key, "depends_on": [previous], "run": NOOP})
            previous = key
        engine.add_steps(run, items)
    client.force_login(make_user("viewer"))
    with django_assert_max_num_queries(12):
        body = client.get(f"/runs/{run.pk}/").content.decode()
    positions = [body.index(f"<code>s{b}-{i}</code>") for b in range(5) for i in range(40)]
    assert positions == sorted(positions)


def test_an_added_wait_step_may_start_with_a_status_and_a_place(plain, rita):
    """The seed's `status` and `step_index`: an agent adds what it has already done."""
    run = engine.open_run(plain, actor=rita).run
    response = add(rita, run, {"key": "notes", "title": "Notes taken", "status": "completed",
                               "step_index": 7},
                   {"key": "triage", "status": "running"})
    assert response.status_code == 201, response.json()
    steps = {s["key"]: s for s in response.json()["steps"]}
    assert steps["notes"]["status"] == "completed" and steps["triage"]["status"] == "running"
    assert Step.objects.get(run=run, key="notes").index == 7
    reports = run.checkpoints.filter(kind="transition").order_by("seq")
    assert [(c.step.key, c.step_status, c.evidence["attempt"]) for c in reports] == [
        ("notes", "completed", 1), ("triage", "running", 1)]


@pytest.mark.parametrize("step, says", [
    ({"key": "ok", "approval": {"group": "qa"}, "status": "completed"}, "approvers decide it"),
    ({"key": "w", "run": NOOP, "status": "completed"}, "only its worker reports it"),
    ({"key": "w", "depends_on": ["draft"], "status": "completed"}, "waiting on dependencies"),
    ({"key": "w", "status": "skipped"}, "status must be one of"),
    ({"key": "w", "depends_on": ["first"], "step_index": 1}, "does not come after step 'first'"),
    ({"key": "w", "step_index": -1}, "step_index must be a whole number"),
])
def test_a_status_or_place_that_would_pass_a_rule_is_refused_and_nothing_added(plain, step,
                                                                            says):
    olga = make_user("olga", "qa", perms=("operate_run", "add_run"))
    run = engine.open_run(plain, actor=olga).run
    before = run.checkpoints.count()
    response = add(olga, run, {"key": "first"}, step)
    assert response.status_code in (400, 409) and says in response.json()["error"]
    assert list(Step.objects.filter(run=run).values_list("key", flat=True)) == ["draft"]
    assert run.checkpoints.count() == before

"""The inbox for someone with many gates: sorted by age or deadline, filtered by group,
workflow and goal (kept in the URL, refused by name when wrong), and each card saying who
else may decide it and who was told of it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from goals.models import Goal
from tests.conftest import make_user
from tests.workflows.helpers import waiting_releases
from workflows import engine
from workflows.delivery import outbox
from workflows.models import Step
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db


def spec(name, group, timeout=None):
    approval = {"group": group, **({"timeout_seconds": timeout} if timeout else {})}
    return store_spec({"name": name, "steps": [
        {"key": "ok", "title": f"{name} sign-off", "approval": approval}]})[0]


@pytest.fixture
def gates(people):
    """Four gates waiting on dave (managers and qa): opened in this order, waiting since
    4, 3, 2 and 1 hours ago, with deadlines that run the other way for two of them."""
    people["dave"].groups.add(*people["bob"].groups.all())
    goal = Goal.objects.create(title="Q4 launch")
    made = {}
    for hours, (name, group, timeout, on_goal) in zip((4, 3, 2, 1), (
            ("payroll", "managers", 86400, False), ("release", "qa", None, True),
            ("payroll", "qa", 3600, True), ("release", "managers", None, False)), strict=True):
        run = engine.open_run(spec(name, group, timeout), actor=people["alice"],
                              goal=goal if on_goal else None, title=f"{name} {hours}").run
        since = timezone.now() - timedelta(hours=hours)
        Step.objects.filter(run=run, key="ok").update(
            waiting_since=since,
            deadline_at=since + timedelta(seconds=timeout) if timeout else None)
        made[run.title] = run
    return made, goal


def titles(body: str, gates_made) -> list[str]:
    found = [(body.index(f"/runs/{run.pk}/'") if f"/runs/{run.pk}/'" in body else
              body.index(f'/runs/{run.pk}/"'), title) for title, run in gates_made.items()
             if f'/runs/{run.pk}/"' in body or f"/runs/{run.pk}/'" in body]
    return [title for _, title in sorted(found)]


def test_sorted_by_age_or_deadline(client, people, gates):
    made, _ = gates
    client.force_login(people["dave"])
    body = client.get("/").content.decode()
    assert titles(body, made) == ["payroll 4", "release 3", "payroll 2", "release 1"]
    body = client.get("/?sort=deadline").content.decode()
    # payroll 2's deadline (in an hour from 2 h ago) is past; payroll 4's is in 20 h.
    assert titles(body, made) == ["payroll 2", "payroll 4", "release 3", "release 1"]
    assert "deadline soonest first" in body


def test_filters_by_group_workflow_and_goal_and_keep_them_in_the_poll(client, people, gates):
    made, goal = gates
    client.force_login(people["dave"])
    assert titles(client.get("/?group=qa").content.decode(), made) == ["release 3",
                                                                      "payroll 2"]
    assert titles(client.get("/?spec=release").content.decode(), made) == ["release 3",
                                                                          "release 1"]
    body = client.get(f"/?goal={goal.pk}&spec=payroll").content.decode()
    assert titles(body, made) == ["payroll 2"]
    assert f"?poll=1&amp;spec=payroll&amp;goal={goal.pk}" in body
    # The filters offer what waits on dave, and show what is chosen.
    assert '<option selected>payroll</option>' in body
    assert f'<option value="{goal.pk}" selected>Q4 launch</option>' in body


def test_a_bad_filter_is_refused_by_name_and_the_rest_applies(client, people, gates):
    made, _ = gates
    client.force_login(people["dave"])
    response = client.get("/?sort=priority&goal=999999&group=qa")
    assert response.status_code == 200
    body = response.content.decode()
    assert ("The inbox's sort filter was ignored: Select a valid choice. priority is not "
            "one of the available choices.") in body
    assert "The inbox's goal filter was ignored" in body
    assert titles(body, made) == ["release 3", "payroll 2"]


def test_an_unknown_group_or_workflow_is_named_as_a_goal_is(client, people, gates):
    client.force_login(people["dave"])
    body = client.get("/?group=qa-typo&spec=payrol").content.decode()
    assert "The inbox's group filter was ignored: there is no group named “qa-typo”." in body
    assert ("The inbox's spec filter was ignored: there is no workflow named “payrol”."
            in body)


def test_a_live_poll_keeps_to_the_filter(client, people, gates):
    made, _ = gates
    client.force_login(people["dave"])
    response = client.get("/?poll=1&group=qa", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert "release 3" in body and "payroll 2" in body
    assert "payroll 4" not in body and "release 1" not in body


def test_each_card_says_who_else_may_decide_and_who_was_told(client, people, settings,
                                                             monkeypatch,
                                                             django_capture_on_commit_callbacks):
    settings.TOLLGATE_NOTIFY = True
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", outbox.deliver)
    make_user("frank", "qa", is_active=False)  # a leaver: never listed
    with django_capture_on_commit_callbacks(execute=True):
        run = engine.open_run(spec("release", "qa"), actor=people["bob"]).run
    assert sorted(m.to[0].split("@")[0] for m in mail.outbox) == ["carol"]
    client.force_login(people["carol"])
    body = client.get("/").content.decode()
    # bob requested it (no self-approval): nobody but carol may decide, and carol was told.
    assert "Nobody else may decide" in body and "Only you can decide it now." in body
    assert "told 1 time" in body and "<bdi>carol</bdi> told by mail" in body
    people["erin"].groups.add(*people["carol"].groups.all())
    body = client.get("/").content.decode()
    assert "1 other may decide" in body and "Also may decide: <bdi>erin</bdi>." in body
    assert run.pk and "frank" not in body
    # The page a mailed link opens says the same.
    from workflows.delivery import links

    gate = run.steps.get(key="ok")
    page = client.get(f"/decide/{links.decision_token(people['carol'], gate)}/")
    page = page.content.decode()
    assert "1 other may decide" in page and "told 1 time" in page


def test_the_deadlines_page_shows_waiting_time_per_group_as_a_distribution(client, people,
                                                                          gates):
    from django.contrib.auth.models import Permission

    from workflows.reads import briefs

    # One more qa gate that has waited ten days.
    long_ago = engine.open_run(spec("release", "qa"), actor=people["alice"]).run
    Step.objects.filter(run=long_ago).update(waiting_since=timezone.now() - timedelta(days=10))
    waited = briefs.waiting_distribution(timezone.now())
    assert waited["bands"] == ["under 1 h", "1-4 h", "4-24 h", "1-3 days", "3-7 days",
                               "over 7 days"]
    # Waiting 4, 3, 2 and 1 hours (the 1-hour one by a hair over) and ten days.
    assert [(g["group"], g["counts"], g["total"]) for g in waited["groups"]] == [
        ("managers", [0, 1, 1, 0, 0, 0], 2), ("qa", [0, 2, 0, 0, 0, 1], 3)]
    people["dave"].user_permissions.add(Permission.objects.get(codename="export_audit"))
    client.force_login(people["dave"])
    body = client.get("/gates/due/").content.decode()
    assert "How long the waiting gates have waited" in body
    assert '<th scope="row">qa</th>' in body and 'max="2" value="1"' in body


def test_a_decision_links_page_says_you_decided_it_once_you_have(client, people,
                                                                 release_spec):
    from workflows.delivery import links

    run = waiting_releases(release_spec, people["alice"], 1)[0]
    gate = run.steps.get(key="qa")
    engine.approve(run, "qa", user=people["bob"], comment="looked")
    client.force_login(people["bob"])
    page = client.get(f"/decide/{links.decision_token(people['bob'], gate)}/")
    assert page.status_code == 403
    assert "You have already decided this gate." in page.content.decode()
    # Someone who may not decide it is told why, in the engine's words.
    client.force_login(people["erin"])
    page = client.get(f"/decide/{links.decision_token(people['erin'], gate)}/")
    assert page.status_code == 403 and "not in the &#x27;qa&#x27; group" in page.content.decode()

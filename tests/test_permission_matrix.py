"""Every action, by every role, through every entry point: each answer pinned.

The engine (and the goal services) keep the rules; this drives the real entry points, the web
form, the htmx press, the JSON API, the admin and the commands, and checks both the answer
and whether anything changed.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from goals.models import Goal
from workflows import engine
from workflows.engine import processes
from workflows.models import ApiToken, Checkpoint, Preference, Run, WorkflowSpec

from .conftest import make_user

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "member", "approver", "delegate", "requester", "operator", "staff",
         "manager", "superuser"]
COMMAND_SPEC = {"name": "build-only", "steps": [{"key": "b", "run": {"command": ["true"]}}]}


@pytest.fixture
def world(release_spec):
    """Users for every role; runs waiting at a gate, failed, and not started; a goal."""
    users = {
        "member": make_user("mia"),
        "approver": make_user("bob", "qa"),
        # In no group: bob is away and named her his delegate, so she decides what he may.
        "delegate": make_user("dee"),
        # In the approver group too: the self-approval rule is what stops her.
        "requester": make_user("rita", "qa", perms=("add_run",)),
        "operator": make_user("olga", "operators",
                              perms=("operate_run", "add_run", "add_workflowspec",
                                     "author_command_spec")),
        "staff": make_user("sam", is_staff=True,
                           perms=("view_run", "view_goal", "view_workflowspec",
                                  "view_apitoken")),
        "manager": make_user("dave", "managers"),
        "superuser": make_user("root", is_staff=True, is_superuser=True),
    }
    make_user("carol", "qa")
    # Where the gate (two approvals) is reassigned: enough people to meet it.
    make_user("rex", "release-team")
    make_user("ruth", "release-team")
    now = timezone.now()
    Preference.objects.create(user=users["approver"], delegate=users["delegate"],
                              away_from=now - timedelta(hours=1),
                              away_until=now + timedelta(days=7))
    rita = users["requester"]
    gate = engine.open_run(release_spec, actor=rita, title="gate").run
    engine.start_step(gate, "build")
    engine.complete_step(gate, "build")
    failed = engine.open_run(release_spec, actor=rita, title="failed").run
    engine.start_step(failed, "build")
    engine.fail_step(failed, "build", retryable=False, summary="boom")
    fresh = engine.open_run(release_spec, actor=rita, title="fresh").run
    engine.add_steps(fresh, [{"key": "agent", "title": "Agent review"}])  # a wait step
    stuck = engine.open_run(release_spec, actor=rita, title="stuck").run
    me = processes.this_process()
    gone = processes.Holder(me.host, me.boot_id, me.pid, (me.started or 0) + 1)  # a dead pid
    step = stuck.steps.get(key="build")
    engine.claim_step(step.pk, owner="dead", lease_seconds=30, holder=gone)
    goal = Goal.objects.create(title="Ship it")
    token = ApiToken.objects.issue(rita, "rita's")[0]
    return {"users": users, "gate": gate, "failed": failed, "fresh": fresh, "stuck": stuck,
            "goal": goal, "token": token}


def browser(world, role, *, htmx=False) -> Client:
    client = Client(**({"HTTP_HX_REQUEST": "true"} if htmx else {}))
    if role != "anonymous":
        client.force_login(world["users"][role])
    return client


def api_client(world, role) -> Client:
    if role == "anonymous":
        return Client(enforce_csrf_checks=True)
    raw = ApiToken.objects.issue(world["users"][role], "matrix")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post_json(client, url, data=None):
    return client.post(url, data or {}, content_type="application/json")


def step_status(run, key):
    return run.steps.get(key=key).status


# What each action changes, read back from the database.
EFFECTS = {
    "approve": lambda w: w["gate"].steps.get(key="qa").approvals.exists(),
    "reject": lambda w: step_status(w["gate"], "qa") == "failed",
    "retry": lambda w: step_status(w["failed"], "build") == "pending",
    "skip": lambda w: step_status(w["fresh"], "build") == "skipped",
    "skip_gate": lambda w: step_status(w["gate"], "qa") == "skipped",
    "reassign": lambda w: Checkpoint.objects.filter(run=w["gate"], kind="gate_reassigned").exists(),
    "cancel": lambda w: Run.objects.get(pk=w["fresh"].pk).status == "cancelled",
    "recover": lambda w: step_status(w["stuck"], "build") == "retrying",
    "start": lambda w: Run.objects.count() == 5,
    "load_spec": lambda w: WorkflowSpec.objects.filter(name="build-only").exists(),
    "token_create": lambda w: ApiToken.objects.filter(name="made").exists(),
    "token_revoke": lambda w: ApiToken.objects.get(pk=w["token"].pk).revoked_at is not None,
    "goal_change": lambda w: Goal.objects.get(pk=w["goal"].pk).status == "completed",
    "add_wait": lambda w: w["fresh"].steps.filter(key="added").exists(),
    "add_command": lambda w: w["fresh"].steps.filter(key="added").exists(),
    "add_shell": lambda w: w["fresh"].steps.filter(key="added").exists(),
    "add_compensation": lambda w: w["fresh"].steps.filter(key="added").exists(),
    "add_gate": lambda w: w["fresh"].steps.filter(key="added").exists(),
    "report_wait": lambda w: step_status(w["fresh"], "agent") == "completed",
    "report_worker": lambda w: step_status(w["fresh"], "build") == "completed",
    "report_gate": lambda w: step_status(w["gate"], "qa") == "completed",
    "note_run": lambda w: Checkpoint.objects.filter(run=w["fresh"], kind="run_note").exists(),
    "start_for_other": lambda w: Run.objects.filter(requested_by__username="mia").exists(),
}

# Who may do it; everyone else is refused. (skip_gate: nobody, whoever asks.)
ALLOWED = {
    "approve": {"approver", "delegate"},
    "reject": {"approver", "delegate"},
    "reassign": {"operator", "superuser"},
    "retry": {"operator", "superuser"},
    "skip": {"operator", "superuser"},
    "skip_gate": set(),
    "cancel": {"operator", "superuser"},
    "recover": {"operator", "superuser"},
    "start": {"requester", "operator", "superuser"},
    "load_spec": {"operator", "superuser"},
    "goal_change": {"superuser"},
    # Steps added at run time: the run's requester (rita) or an operator, and for programs
    # author_command_spec too (olga holds it, rita does not); a gate only an operator adds.
    "add_wait": {"requester", "operator", "superuser"},
    "add_command": {"operator", "superuser"},
    "add_shell": {"operator", "superuser"},
    "add_compensation": {"operator", "superuser"},
    "add_gate": {"operator", "superuser"},
    # /transition: a wait step, by those who may work on the run; a worker step or a gate,
    # by nobody (409 for those who may work on the run, 403 for the rest).
    "report_wait": {"requester", "operator", "superuser"},
    "report_worker": set(),
    "report_gate": set(),
    # A note on the run (/transition without a step): as a wait step's report.
    "note_run": {"requester", "operator", "superuser"},
    # A run opened for someone else: its own permission (only the superuser holds it here).
    "start_for_other": {"superuser"},
}
REFUSED_AS_CONFLICT = {"report_worker": {"requester", "operator", "superuser"},
                       "report_gate": {"requester", "operator", "superuser"}}

ADDED = {
    "add_wait": {"key": "added"},
    "add_command": {"key": "added", "run": {"command": ["id"]}},
    "add_shell": {"key": "added", "run": {"shell": "id"}},
    "add_compensation": {"key": "added", "run": {"callable": "workflows.callables.noop"},
                         "compensation": {"shell": "id"}},
    "add_gate": {"key": "added", "approval": {"group": "qa"}},
}


def web_press(world, role, action, *, htmx=False):
    client = browser(world, role, htmx=htmx)
    run, key, verb, data = {
        "approve": (world["gate"], "qa", "approve", {"comment": "ok"}),
        "reject": (world["gate"], "qa", "reject", {"comment": "no"}),
        "retry": (world["failed"], "build", "retry", {}),
        "skip": (world["fresh"], "build", "skip", {"comment": "prebuilt"}),
        "skip_gate": (world["gate"], "qa", "skip", {"comment": "hurry"}),
        "reassign": (world["gate"], "qa", "reassign", {"group": "release-team",
                                                       "comment": "qa is away"}),
    }[action]
    return client.post(f"/runs/{run.pk}/steps/{key}/{verb}/", data)


def web_cancel(world, role, *, htmx=False):
    return browser(world, role, htmx=htmx).post(f"/runs/{world['fresh'].pk}/cancel/",
                                                {"reason": "matrix"})


def web_recover(world, role, *, htmx=False):
    return browser(world, role, htmx=htmx).post(f"/runs/{world['stuck'].pk}/recover/")


WEB_RUN_ACTIONS = {"cancel": web_cancel, "recover": web_recover}


def api_call(world, role, action):
    client = api_client(world, role)
    if action == "goal_change":
        return client.patch(f"/api/goals/{world['goal'].pk}", {"status": "completed"},
                            content_type="application/json")
    gate, failed, fresh = world["gate"].pk, world["failed"].pk, world["fresh"].pk
    if action in ADDED:
        return post_json(client, f"/api/runs/{fresh}/steps", {"steps": [ADDED[action]]})
    if action == "note_run":
        return post_json(client, f"/api/runs/{fresh}/transition", {"summary": "halfway"})
    if action == "start_for_other":
        return post_json(client, "/api/runs", {"spec": "release", "owner": "mia"})
    if action.startswith("report_"):
        run, key = {"report_wait": (fresh, "agent"), "report_worker": (fresh, "build"),
                    "report_gate": (gate, "qa")}[action]
        return post_json(client, f"/api/runs/{run}/transition", {
            "step": key, "step_status": "completed", "summary": "done, trust me"})
    url, body = {
        "approve": (f"/api/runs/{gate}/steps/qa/approve", {"comment": "ok"}),
        "reject": (f"/api/runs/{gate}/steps/qa/reject", {"comment": "no"}),
        "retry": (f"/api/runs/{failed}/steps/build/retry", {}),
        "skip": (f"/api/runs/{fresh}/steps/build/skip", {"reason": "prebuilt"}),
        "skip_gate": (f"/api/runs/{gate}/steps/qa/skip", {"reason": "hurry"}),
        "reassign": (f"/api/runs/{gate}/steps/qa/reassign", {"group": "release-team",
                                                             "reason": "qa is away"}),
        "cancel": (f"/api/runs/{fresh}/cancel", {"reason": "matrix"}),
        "recover": (f"/api/runs/{world['stuck'].pk}/recover", {}),
        "start": ("/api/runs", {"spec": "release"}),
        "load_spec": ("/api/specs", COMMAND_SPEC),
    }[action]
    return post_json(client, url, body)


WEB_DENIED = 403
HTMX_DENIED = 403


def expect(world, action, role, response, *, denied: int, success=(200, 201, 302)):
    ok = role in ALLOWED[action]
    changed = EFFECTS[action](world)
    if ok:
        assert changed and response.status_code in success, (action, role, response.status_code)
        return
    assert not changed, (action, role)
    if role == "anonymous":
        assert response.status_code in (302, 401), (action, role, response.status_code)
        if response.status_code == 302:
            assert response["Location"].startswith("/login/")
    else:
        expected = 409 if action == "skip_gate" or role in REFUSED_AS_CONFLICT.get(
            action, ()) else denied
        assert response.status_code == expected, (action, role, response.status_code,
                                                  response.content[:300])


WEB_ACTIONS = ["approve", "reject", "reassign", "retry", "skip", "skip_gate", "cancel",
               "recover"]


def web_action(world, role, action, *, htmx=False):
    if action in WEB_RUN_ACTIONS:
        return WEB_RUN_ACTIONS[action](world, role, htmx=htmx)
    return web_press(world, role, action, htmx=htmx)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", WEB_ACTIONS)
def test_web_form(world, action, role):
    expect(world, action, role, web_action(world, role, action), denied=WEB_DENIED)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", WEB_ACTIONS)
def test_htmx_press(world, action, role):
    response = web_action(world, role, action, htmx=True)
    expect(world, action, role, response, denied=HTMX_DENIED)
    if role != "anonymous" and response.status_code != 302:
        assert b"<html" not in response.content  # a fragment for the page, not a new page


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", [*WEB_ACTIONS, "start", "load_spec", "goal_change",
                                    *ADDED, "report_wait", "report_worker", "report_gate",
                                    "note_run", "start_for_other"])
def test_api(world, action, role):
    response = api_call(world, role, action)
    expect(world, action, role, response, denied=403)
    if role == "anonymous":
        assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("entry", ["web", "htmx", "api"])
def test_a_reassigned_gate_is_decided_by_its_new_approver_alone(world, role, entry):
    from workflows.models import Approval

    # carol gives one of the two approvals; the other is reassigned to mia alone.
    carol = world["users"]["approver"].__class__.objects.get(username="carol")
    engine.approve(world["gate"], "qa", user=carol)
    engine.reassign_gate(world["gate"], "qa", actor=world["users"]["operator"],
                         person=world["users"]["member"], reason="mia knows the release")
    if entry == "api":
        response = api_call(world, role, "approve")
    else:
        response = web_press(world, role, "approve", htmx=entry == "htmx")
    approved = Approval.objects.exclude(user=carol).exists()
    # The qa group (bob, and dee for him) no longer decides it; mia does.
    assert approved == (role == "member"), (entry, role, response.status_code)
    if role not in ("member", "anonymous"):
        assert response.status_code == 403, (entry, role, response.status_code)


ADMIN = {
    "cancel": ("/admin/workflows/run/", "cancel_runs", lambda w: w["fresh"].pk),
    "goal_change": ("/admin/goals/goal/", "mark_completed", lambda w: w["goal"].pk),
    "token_revoke": ("/admin/workflows/apitoken/", "revoke_tokens", lambda w: w["token"].pk),
}
ADMIN_ALLOWED = {"cancel": {"superuser"}, "goal_change": {"superuser"},
                 "token_revoke": {"superuser"}}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", sorted(ADMIN))
def test_admin_action(world, action, role):
    url, name, pk = ADMIN[action]
    response = browser(world, role).post(url, {"action": name,
                                               "_selected_action": [pk(world)]})
    changed = EFFECTS[action](world)
    assert changed == (role in ADMIN_ALLOWED[action]), (action, role)
    if role in ("anonymous", "member", "approver", "delegate", "requester", "operator",
                "manager"):
        assert response.status_code == 302 and "login" in response["Location"]


def test_admin_action_with_the_permission_but_not_superuser(world):
    olga = world["users"]["operator"]
    olga.is_staff = True
    olga.save()
    olga.user_permissions.add(Permission.objects.get(codename="view_run"))
    browser(world, "operator").post("/admin/workflows/run/", {
        "action": "cancel_runs", "_selected_action": [world["fresh"].pk]})
    assert EFFECTS["cancel"](world)


@pytest.mark.parametrize("role", ROLES)
def test_admin_spec_form(world, role):
    import json

    response = browser(world, role).post("/admin/workflows/workflowspec/add/", {
        "name": "build-only", "definition": json.dumps(COMMAND_SPEC)})
    assert EFFECTS["load_spec"](world) == (role == "superuser"), role
    assert response.status_code in (200, 302, 403)


@pytest.mark.parametrize("role", ROLES)
def test_web_token_create_is_for_yourself(world, role):
    response = browser(world, role).post("/profile/", {"name": "made"})
    made = ApiToken.objects.filter(name="made").first()
    if role == "anonymous":
        assert made is None and response.status_code == 302
    else:
        assert made is not None and made.user == world["users"][role]


@pytest.mark.parametrize("role", [r for r in ROLES if r != "requester"])
def test_web_token_revoke_only_your_own(world, role):
    response = browser(world, role).post(f"/profile/tokens/{world['token'].pk}/revoke/")
    assert EFFECTS["token_revoke"](world) is False
    assert response.status_code in ((302,) if role == "anonymous" else (404,))


def test_web_token_revoke_by_its_owner(world):
    response = browser(world, "requester").post(f"/profile/tokens/{world['token'].pk}/revoke/")
    assert response.status_code == 302 and EFFECTS["token_revoke"](world)


class TestCommandsActAsTheSystem:
    """Whoever may run manage.py on the server holds its keys: commands are not refused."""

    def test_start_run(self, world):
        call_command("start_run", "release", stdout=io.StringIO())
        assert EFFECTS["start"](world)

    def test_load_workflow(self, world, tmp_path):
        import json

        path = tmp_path / "spec.json"
        path.write_text(json.dumps(COMMAND_SPEC))
        call_command("load_workflow", str(path), stdout=io.StringIO())
        assert EFFECTS["load_spec"](world)

    def test_recover(self, world):
        call_command("recover", str(world["stuck"].pk), stdout=io.StringIO())
        assert EFFECTS["recover"](world)

    def test_create_token(self, world):
        call_command("create_token", "rita", "--name", "made", stdout=io.StringIO())
        assert EFFECTS["token_create"](world)


# Reading under TOLLGATE_RUN_VISIBILITY "involved": the gate's run is its requester's, its
# approver group's, the operators' and the superusers'; every entry point follows the rule.
# The delegate reads what her gates are on while she decides for bob.
READERS = {"requester", "approver", "delegate", "operator", "superuser"}


def read_cell(world, role, entry):
    gate = world["gate"]
    if entry == "api":
        return api_client(world, role).get(f"/api/runs/{gate.pk}")
    client = browser(world, role, htmx=entry == "htmx_refusal")
    if entry == "run_page":
        return client.get(f"/runs/{gate.pk}/")
    if entry == "htmx_refusal":  # a reject with no comment: refused, whoever asks
        return client.post(f"/runs/{gate.pk}/steps/qa/reject/", {"view": "inbox"})
    if entry == "progress":
        return client.get("/goals/progress/")
    if entry == "admin_list":
        return client.get("/admin/workflows/run/")
    if entry == "admin_page":
        return client.get(f"/admin/workflows/run/{gate.pk}/change/")
    raise AssertionError(entry)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("entry", ["run_page", "htmx_refusal", "progress", "admin_list",
                                   "admin_page", "api"])
def test_who_reads_a_run_under_involved_visibility(world, settings, role, entry):
    settings.TOLLGATE_RUN_VISIBILITY = "involved"
    gate = world["gate"]
    world["users"]["staff"].user_permissions.add(Permission.objects.get(codename="view_run"))
    response = read_cell(world, role, entry)
    body = response.content.decode()
    link = f"/runs/{gate.pk}/"
    reads = role in READERS
    if role == "anonymous":
        assert response.status_code in (302, 401), (entry, response.status_code)
        return
    if entry in ("run_page", "api"):
        assert response.status_code == (200 if reads else 404), (entry, role)
    elif entry == "htmx_refusal":
        assert EFFECTS["reject"](world) is False
        if reads:  # the card again, saying why
            assert response.status_code in (400, 403) and "comment is required" in body \
                or "not in the" in body or "cannot decide" in body, (role, body[:300])
        else:  # nothing of the run: not its card, not its title
            assert response.status_code == 404 and "<article" not in body, (role, body[:300])
    elif entry == "progress":
        assert response.status_code == 200
        assert (link in body) == reads, role
    elif role in ("staff", "superuser"):  # the admin is for staff
        admin_url = f"/admin/workflows/run/{gate.pk}/change/"
        if entry == "admin_list":
            assert response.status_code == 200 and (admin_url in body) == reads, role
        else:
            assert (response.status_code == 200) == reads, (role, response.status_code)
    else:
        assert response.status_code == 302 and "login" in response["Location"]


# Chat is one more entry point: a Slack press, signed, acknowledged, then decided by the
# worker as the linked user (an unlinked account, "anonymous", is asked to link first).
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", ["approve", "reject"])
def test_chat_press(world, action, role, settings, monkeypatch):
    from tests.workflows.chat.fake_slack import (
        SIGNING_SECRET,
        TEAM,
        TOKEN,
        FakeSlack,
        button,
        submission,
    )
    from workflows.chat import interactions, slack
    from workflows.models import ChatIdentity

    fake = FakeSlack()
    settings.TOLLGATE_SLACK_BOT_TOKEN, settings.TOLLGATE_SLACK_SIGNING_SECRET = (
        TOKEN, SIGNING_SECRET)
    settings.TOLLGATE_SLACK_API_URL = fake.api_url
    doorbells = []
    monkeypatch.setattr("workflows.delivery.dispatch.handle_chat_press", doorbells.append)
    monkeypatch.setattr("workflows.delivery.dispatch.deliver_outbox", lambda pk: None)
    if role != "anonymous":
        ChatIdentity.objects.create(provider="slack", team=TEAM, chat_user="U1",
                                    user=world["users"][role], matched_by="link")
    gate = world["gate"].steps.get(key="qa")
    payload = (button(gate, "approve", "U1", role) if action == "approve"
               else submission(gate, "reject", "U1", role, comment="no"))
    body = fake.body(payload)
    try:
        response = Client().post("/chat/slack/interactions/", body,
                                 content_type="application/x-www-form-urlencoded",
                                 headers=fake.signed(body))
        assert response.status_code == 200
        for pk in doorbells:
            interactions.handle(slack.provider(), pk)
        allowed = role in ALLOWED[action]
        assert EFFECTS[action](world) == allowed
        assert bool(fake.calls_of("chat.postEphemeral")) == (not allowed)
    finally:
        fake.stop()


# Approval power through the admin: a manager, a delegate, a chat account or a company
# identity linked to someone decides as them. Each needs a superuser or its own named
# permission; a staff member holding only the model's plain add or change gets none of it.
NARROW_PERMS = {"delegate": ("change_preference", "add_preference", "view_preference"),
                "manager": ("change_preference", "add_preference", "view_preference"),
                "chat_link": ("add_chatidentity", "view_chatidentity"),
                "sso_link": ("add_ssoidentity", "view_ssoidentity")}
NAMED_PERM = {"delegate": "set_approval_power", "manager": "set_approval_power",
              "chat_link": "link_chat_identity"}


def admin_power(world, role, power):
    """Make `role` bob's delegate / the requester's manager / link a Slack account or a
    company identity to bob, through the admin; returns whether it took."""
    from workflows.models import ChatIdentity, SsoIdentity

    me, bob = world["users"].get(role), world["users"]["approver"]
    client = browser(world, role)
    if power in ("delegate", "manager"):
        target = bob if power == "delegate" else world["users"]["requester"]
        pref, _ = Preference.objects.get_or_create(user=target)
        carol = bob.__class__.objects.get(username="carol")
        Preference.objects.filter(pk=pref.pk).update(delegate=carol if pref.delegate_id else None)
        pref.refresh_from_db()
        now = timezone.now()
        away = {"away_from_0": (now - timedelta(hours=1)).strftime("%Y-%m-%d"),
                "away_from_1": "00:00:00",
                "away_until_0": (now + timedelta(days=3)).strftime("%Y-%m-%d"),
                "away_until_1": "00:00:00"} if power == "delegate" else {}
        client.post(f"/admin/workflows/preference/{pref.pk}/change/", {
            "user": target.pk, "time_zone": "",
            "manager": me.pk if power == "manager" and me else "",
            "delegate": me.pk if power == "delegate" and me else "", **away})
        pref.refresh_from_db()
        field = pref.delegate_id if power == "delegate" else pref.manager_id
        return me is not None and field == me.pk and me.pk != bob.pk
    if power == "chat_link":
        client.post("/admin/workflows/chatidentity/add/", {
            "provider": "slack", "team": "T1", "chat_user": "U-MINE", "name": "bob",
            "user": bob.pk})
        return ChatIdentity.objects.filter(chat_user="U-MINE").exists()
    client.post("/admin/workflows/ssoidentity/add/", {
        "user": bob.pk, "issuer": "https://id.example", "subject": "mine"})
    return SsoIdentity.objects.filter(subject="mine").exists()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("power", ["delegate", "manager", "chat_link", "sso_link"])
def test_approval_power_through_the_admin(world, role, power):
    if role == "staff":  # sam holds the model's plain rights, not the named one
        world["users"]["staff"].user_permissions.add(
            *Permission.objects.filter(codename__in=NARROW_PERMS[power]))
    assert admin_power(world, role, power) == (role == "superuser"), (power, role)


@pytest.mark.parametrize("power", ["delegate", "manager", "chat_link"])
def test_the_named_permission_gives_approval_power(world, power):
    sam = world["users"]["staff"]
    sam.user_permissions.add(*Permission.objects.filter(
        codename__in=(*NARROW_PERMS[power], NAMED_PERM[power])))
    assert admin_power(world, "staff", power)


def reassign_refused(world, entry, person: str, says: str) -> None:
    """The operator reassigns the gate to `person` through `entry`: refused (400) saying
    `says`, and nothing changed."""
    if entry == "command":
        with pytest.raises(Exception, match=says):
            call_command("reassign", str(world["gate"].pk), "qa", "--person", person,
                         "--reason", "why not", stdout=io.StringIO())
    elif entry == "api":
        response = post_json(api_client(world, "operator"),
                             f"/api/runs/{world['gate'].pk}/steps/qa/reassign",
                             {"person": person, "reason": "why not"})
        assert response.status_code == 400 and says in response.json()["error"]
    else:
        response = browser(world, "operator", htmx=entry == "htmx").post(
            f"/runs/{world['gate'].pk}/steps/qa/reassign/",
            {"person": person, "comment": "why not"})
        assert response.status_code == 400 and says in response.content.decode()
    assert not EFFECTS["reassign"](world)


@pytest.mark.parametrize("entry", ["web", "htmx", "api", "command"])
def test_a_reassignment_that_cannot_be_met_is_refused(world, entry):
    """The gate needs two approvals: one person (mia) cannot give both."""
    reassign_refused(world, entry, "mia", "needs 2 more approvals")


# Commands act as the system (no person to hand the gate to themselves).
@pytest.mark.parametrize("entry", ["web", "htmx", "api"])
def test_an_operator_cannot_reassign_a_gate_to_herself(world, entry):
    olga = world["users"]["operator"]
    olga.groups.add(world["users"]["approver"].groups.get())  # she could decide for qa
    reassign_refused(world, entry, "olga", "themselves")


@pytest.mark.parametrize("entry", ["web", "htmx", "api"])
def test_an_operator_cannot_reassign_a_gate_to_someone_away_she_stands_in_for(world, entry):
    """Not to herself by the back door: a person away who named her their delegate."""
    from datetime import timedelta

    from workflows.models import Preference
    from workflows.timing import clock

    olga, mia = world["users"]["operator"], world["users"]["member"]
    now = clock.now()
    Preference.objects.update_or_create(user=mia, defaults={
        "delegate": olga, "away_from": now - timedelta(hours=1),
        "away_until": now + timedelta(days=2)})
    reassign_refused(world, entry, "mia", "as their delegate")

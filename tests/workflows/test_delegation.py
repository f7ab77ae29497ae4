"""Delegation while someone is away, and an operator's reassignment of a waiting gate."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from workflows import engine
from workflows.delivery.notifications import messages_for
from workflows.delivery.outbox import notification_events
from workflows.engine import Announcement
from workflows.models import ApiToken, Approval, Checkpoint, Preference
from workflows.people import permissions
from workflows.reads import selectors
from workflows.specs.storage import store_spec

from ..conftest import make_user

pytestmark = pytest.mark.django_db

TWO_EYES = {"name": "two-eyes", "steps": [
    {"key": "qa", "title": "QA sign-off", "approval": {"group": "qa", "required": 2}}]}


@pytest.fixture
def team(db):
    return {
        "rita": make_user("rita", perms=("add_run",)),
        "pat": make_user("pat", "qa"),  # goes on leave
        "dee": make_user("dee"),  # pat's delegate, in no group
        "quinn": make_user("quinn", "qa"),
        "sam": make_user("sam", "qa"),
        "olga": make_user("olga", "operators", perms=("operate_run",)),
        "fin": make_user("fin", "finance"),
    }


def away(person, delegate, *, starts=-1, ends=24):
    now = timezone.now()
    return Preference.objects.update_or_create(user=person, defaults={
        "delegate": delegate, "away_from": now + timedelta(hours=starts),
        "away_until": now + timedelta(hours=ends)})[0]


@pytest.fixture
def gate_run(team):
    spec = store_spec(TWO_EYES)[0]
    return engine.open_run(spec, actor=team["rita"]).run


class TestDelegation:
    def test_the_delegate_decides_for_the_person_away_and_it_says_so(self, team, gate_run):
        away(team["pat"], team["dee"])
        gate = gate_run.steps.get(key="qa")
        assert list(permissions.decidable_by(team["dee"])) == [gate]
        assert selectors.inbox_count(team["dee"]) == 1
        assert "dee" in set(permissions.deciders(gate_run, gate).values_list(
            "username", flat=True))
        checkpoint = engine.approve(gate_run, "qa", user=team["dee"], comment="looks fine")
        decision = Approval.objects.get(step=gate, user=team["dee"])
        assert decision.on_behalf_of == team["pat"]
        assert checkpoint.evidence["for"] == "pat"
        assert checkpoint.summary == "For pat: looks fine"
        # pat counts once: through dee. Neither decides this attempt again.
        with pytest.raises(engine.IllegalTransition, match="pat has already decided"):
            engine.approve(gate_run, "qa", user=team["pat"])
        assert not permissions.decidable_by(team["pat"]).filter(pk=gate.pk).exists()
        engine.approve(gate_run, "qa", user=team["quinn"])
        assert gate_run.steps.get(key="qa").status == "completed"

    def test_the_run_page_shows_the_decision_as_made_for_them(self, team, gate_run, client):
        away(team["pat"], team["dee"])
        engine.approve(gate_run, "qa", user=team["dee"])
        client.force_login(team["quinn"])
        page = client.get(f"/runs/{gate_run.pk}/").content.decode()
        assert "<bdi>dee</bdi> for <bdi>pat</bdi> approved" in page

    @pytest.mark.parametrize("starts, ends", [(-48, -1), (2, 24)])
    def test_outside_the_away_period_the_delegate_decides_nothing(self, team, gate_run,
                                                                  starts, ends):
        away(team["pat"], team["dee"], starts=starts, ends=ends)
        gate = gate_run.steps.get(key="qa")
        assert not permissions.decidable_by(team["dee"]).exists()
        assert "not in the 'qa' group" in permissions.decide_refusal(team["dee"], gate_run,
                                                                     gate)
        with pytest.raises(engine.NotPermitted):
            engine.approve(gate_run, "qa", user=team["dee"])

    def test_never_for_the_delegates_own_runs(self, team):
        away(team["pat"], team["dee"])
        team["dee"].user_permissions.add(*team["rita"].user_permissions.all())
        run = engine.open_run(store_spec(TWO_EYES)[0], actor=team["dee"]).run
        gate = run.steps.get(key="qa")
        assert not permissions.decidable_by(team["dee"]).filter(pk=gate.pk).exists()
        assert "dee" not in set(permissions.deciders(run, gate).values_list(
            "username", flat=True))
        with pytest.raises(engine.NotPermitted, match="a delegate never decides their own"):
            engine.approve(run, "qa", user=team["dee"])

    def test_four_eyes_hold_when_the_delegate_is_an_approver_too(self, team, gate_run):
        away(team["pat"], team["quinn"])  # quinn is in qa as well
        engine.approve(gate_run, "qa", user=team["quinn"])
        # One person deciding for two counts once: quinn cannot approve again for pat.
        with pytest.raises(engine.IllegalTransition, match="quinn has already decided"):
            engine.approve(gate_run, "qa", user=team["quinn"])
        gate = gate_run.steps.get(key="qa")
        assert gate.status == "waiting_approval"
        assert Approval.objects.get(step=gate).on_behalf_of is None  # as herself
        engine.approve(gate_run, "qa", user=team["sam"])
        assert gate_run.steps.get(key="qa").status == "completed"

    def test_a_person_away_may_still_decide_themselves(self, team, gate_run):
        away(team["pat"], team["dee"])
        engine.approve(gate_run, "qa", user=team["pat"])
        with pytest.raises(engine.NotPermitted, match="pat has already decided"):
            engine.approve(gate_run, "qa", user=team["dee"])

    def test_the_profile_sets_and_clears_an_away_period(self, team, client):
        client.force_login(team["pat"])
        response = client.post("/profile/", {"away": "1", "away_from": "2026-12-20T09:00",
                                             "away_until": "2027-01-04T09:00",
                                             "delegate": "dee"})
        assert response.status_code == 302
        preference = Preference.objects.get(user=team["pat"])
        assert preference.delegate == team["dee"] and preference.away_until.year == 2027
        page = client.get("/profile/").content.decode()
        assert "<b><bdi>dee</bdi></b> decides your gates" in page
        client.post("/profile/", {"back": "1"})
        preference.refresh_from_db()
        assert preference.delegate is None and preference.away_from is None

    @pytest.mark.parametrize("form, problem", [
        ({"away_from": "2027-01-04T09:00", "away_until": "2026-12-20T09:00", "delegate": "dee"},
         "The away period must end after it starts."),
        ({"away_from": "2026-12-20T09:00", "away_until": "2027-01-04T09:00",
          "delegate": "nobody"}, "There is no active person named &#x27;nobody&#x27;."),
        ({"away_from": "2026-12-20T09:00", "away_until": "2027-01-04T09:00",
          "delegate": "pat"}, "A person cannot be their own delegate."),
    ])
    def test_a_bad_away_period_is_refused_and_nothing_saved(self, team, client, form, problem):
        client.force_login(team["pat"])
        response = client.post("/profile/", {"away": "1", **form}, follow=True)
        assert problem in response.content.decode()
        assert not Preference.objects.filter(user=team["pat"], delegate__isnull=False).exists()

    def test_an_admin_sets_it_for_someone(self, team, client):
        root = make_user("root", is_staff=True, is_superuser=True)
        client.force_login(root)
        response = client.post("/admin/workflows/preference/add/", {
            "user": team["pat"].pk, "time_zone": "", "manager": "", "delegate": team["dee"].pk,
            "away_from_0": "2026-12-20", "away_from_1": "09:00",
            "away_until_0": "2027-01-04", "away_until_1": "09:00"})
        assert response.status_code == 302, response.content.decode()[:2000]
        assert Preference.objects.get(user=team["pat"]).delegate == team["dee"]


class TestReassignment:
    def test_to_a_person(self, team, gate_run):
        engine.approve(gate_run, "qa", user=team["quinn"])  # 1 of 2: one person may give 1
        checkpoint = engine.reassign_gate(gate_run, "qa", actor=team["olga"],
                                          person=team["fin"], reason="fin owns this area")
        assert checkpoint.kind == "gate_reassigned"
        assert checkpoint.evidence == {"rule": "qa", "from": "qa", "to": "fin",
                                       "reason": "fin owns this area"}
        assert checkpoint.summary == "Reassigned from qa to fin: fin owns this area"
        gate = gate_run.steps.get(key="qa")
        assert list(permissions.deciders(gate_run, gate).values_list("username", flat=True)) \
            == ["fin"]
        # The new approvers are told.
        announcement = Announcement(run_id=gate_run.pk, run_status=gate_run.status,
                                    previous_status=gate_run.status, checkpoint=checkpoint)
        assert ("gate_reassigned", "qa") in notification_events(announcement)
        checkpoint = Checkpoint.objects.select_related("run", "run__requested_by").get(
            pk=checkpoint.pk)
        mailed = [(user.username, subject) for user, subject, _, _, _ in messages_for(
            checkpoint, "gate_reassigned", "qa")]
        assert mailed == [("fin", f"[Tollgate] QA sign-off was reassigned to fin: {gate_run}")]
        with pytest.raises(engine.NotPermitted, match="it waits on fin"):
            engine.approve(gate_run, "qa", user=team["sam"])
        engine.approve(gate_run, "qa", user=team["fin"])
        assert gate_run.steps.get(key="qa").status == "completed"

    def test_to_fewer_people_than_it_needs_is_refused_saying_so(self, team, gate_run):
        with pytest.raises(engine.InvalidInput, match="needs 2 more approvals from distinct "
                                                      "people; fin would leave 1"):
            engine.reassign_gate(gate_run, "qa", actor=team["olga"], person=team["fin"],
                                 reason="fin owns this area")
        with pytest.raises(engine.InvalidInput, match="the finance group would leave 1"):
            engine.reassign_gate(gate_run, "qa", actor=team["olga"], group="finance",
                                 reason="finance owns this area")
        # The requester and whoever already decided do not count.
        engine.approve(gate_run, "qa", user=team["quinn"])
        team["rita"].groups.add(Group.objects.get(name="finance"))
        with pytest.raises(engine.InvalidInput, match="quinn would leave 0"):
            engine.reassign_gate(gate_run, "qa", actor=team["olga"], person=team["quinn"],
                                 reason="quinn again")
        assert not Checkpoint.objects.filter(run=gate_run, kind="gate_reassigned").exists()

    def test_to_a_group_keeps_the_decisions_counted(self, team, gate_run):
        engine.approve(gate_run, "qa", user=team["quinn"])
        engine.reassign_gate(gate_run, "qa", actor=team["olga"], group="finance",
                             reason="qa is at the offsite")
        gate = gate_run.steps.get(key="qa")
        assert gate.approval_group == "finance"
        engine.approve(gate_run, "qa", user=team["fin"])
        assert gate_run.steps.get(key="qa").status == "completed"

    @pytest.mark.parametrize("kwargs, problem", [
        ({"group": "finance", "reason": ""}, "the reason is required"),
        ({"group": "", "reason": "r"}, "name exactly one"),
        ({"group": "finance", "person": "fin", "reason": "r"}, "name exactly one"),
        ({"group": "no-such-group", "reason": "r"}, "There is no group named"),
        ({"person": "ghost", "reason": "r"}, "There is no active person named 'ghost'"),
        ({"person": "rita", "reason": "r"}, "rita requested run .* cannot decide QA sign-off"),
        ({"group": "finance", "reason": "r", "rule": "nope"},
         "QA sign-off has no waiting rule named"),
    ])
    def test_bad_input_is_refused_and_changes_nothing(self, team, gate_run, kwargs, problem):
        with pytest.raises(engine.InvalidInput, match=problem):
            engine.reassign_gate(gate_run, "qa", actor=team["olga"], **kwargs)
        assert not Checkpoint.objects.filter(run=gate_run, kind="gate_reassigned").exists()
        assert gate_run.steps.get(key="qa").approval_group == "qa"

    def test_only_an_operator_reassigns(self, team, gate_run):
        with pytest.raises(engine.NotPermitted, match="operator permission"):
            engine.reassign_gate(gate_run, "qa", actor=team["quinn"], group="finance",
                                 reason="mine now")

    def test_a_gate_waiting_on_several_rules_needs_the_rule_named(self, team):
        spec = store_spec({"name": "dual", "steps": [{"key": "g", "approval": {"rules": [
            {"group": "qa"}, {"group": "finance"}]}}]})[0]
        run = engine.open_run(spec, actor=team["rita"]).run
        with pytest.raises(engine.InvalidInput, match=r"several rules \(qa, finance\)"):
            engine.reassign_gate(run, "g", actor=team["olga"], person="pat", reason="r")
        engine.reassign_gate(run, "g", actor=team["olga"], person="pat", reason="r",
                             rule="finance")
        assert [r.audience for r in run.steps.get(key="g").approval_rules.order_by(
            "position")] == ["qa", "pat"]

    def test_from_the_run_page_the_api_and_the_command(self, team, gate_run, client):
        engine.approve(gate_run, "qa", user=team["quinn"])  # one more is needed
        client.force_login(team["olga"])
        page = client.get(f"/runs/{gate_run.pk}/").content.decode()
        assert "Reassign" in page
        response = client.post(f"/runs/{gate_run.pk}/steps/qa/reassign/",
                               {"group": "finance", "comment": "page"})
        assert response.status_code == 302
        token = ApiToken.objects.issue(team["olga"], "t")[1]
        response = client.post(f"/api/runs/{gate_run.pk}/steps/qa/reassign",
                               {"person": "pat", "reason": "api"},
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 200, response.content
        out = io.StringIO()
        call_command("reassign", str(gate_run.pk), "qa", "--group", "qa", "--reason",
                     "command", "--as", "olga", stdout=out)
        assert "Reassigned from pat to qa: command" in out.getvalue()
        reasons = list(Checkpoint.objects.filter(run=gate_run, kind="gate_reassigned")
                       .order_by("seq").values_list("evidence__reason", "actor_name"))
        assert reasons == [("page", "olga"), ("api", "olga"), ("command", "olga")]
        with pytest.raises(CommandError, match="There is no group named"):
            call_command("reassign", str(gate_run.pk), "qa", "--group", "nope",
                         "--reason", "x", stdout=out)


def test_the_inbox_says_who_stands_in_before_anyone_decides(release_spec, people):
    """Delegation shown before it is used: the delegate's card names the person away and
    until when; the away person's inbox says they are away and who stands in."""
    from datetime import timedelta

    from django.test import Client

    from workflows import engine
    from workflows.models import Preference
    from workflows.timing import clock

    until = clock.now() + timedelta(days=3)
    Preference.objects.create(user=people["carol"], away_from=clock.now() - timedelta(hours=1),
                              away_until=until, delegate=people["dave"])
    run = engine.open_run(release_spec, actor=people["alice"]).run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    dave = Client()
    dave.force_login(people["dave"])
    card = dave.get("/").content.decode()
    assert "You decide this for <b><bdi>carol</bdi></b>, who is away until" in card
    carol = Client()
    carol.force_login(people["carol"])
    own = carol.get("/").content.decode()
    assert "You are away until" in own and "<bdi>dave</bdi></b> decides your gates" in own
    bob = Client()
    bob.force_login(people["bob"])
    page = bob.get("/").content.decode()
    assert "You decide this for" not in page and "You are away" not in page

"""The admin keeps the engine's rules: tokens, revocation, decisions, schedules, webhooks."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client

from workflows import engine
from workflows.delivery import webhooks
from workflows.delivery.addresses import RefusedAddress, check_url
from workflows.models import ApiToken, Approval, Schedule, Webhook, WebhookDelivery
from workflows.specs.storage import store_spec
from workflows.timing.schedules import save_schedule

from ..conftest import make_user

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class TestTokens:
    def test_staff_with_token_permissions_mints_only_for_themselves(self):
        root = make_user("root", is_staff=True, is_superuser=True)
        sam = make_user("sam", is_staff=True, perms=("add_apitoken", "view_apitoken",
                                                     "change_apitoken"))
        page = signed_in(sam).post("/admin/workflows/apitoken/add/",
                                   {"user": root.pk, "name": "made"})
        assert page.status_code == 200  # the form refuses it: root is not a choice
        assert not ApiToken.objects.filter(name="made").exists()
        signed_in(sam).post("/admin/workflows/apitoken/add/", {"user": sam.pk, "name": "mine"})
        assert ApiToken.objects.get(name="mine").user == sam
        with pytest.raises(PermissionDenied, match="only for themselves"):
            ApiToken.objects.issue(root, "x", actor=sam)

    def test_a_superuser_mints_for_anyone(self):
        root = make_user("root", is_staff=True, is_superuser=True)
        rita = make_user("rita")
        signed_in(root).post("/admin/workflows/apitoken/add/", {"user": rita.pk, "name": "r"})
        assert ApiToken.objects.get(name="r").user == rita

    def test_revocation_is_final(self):
        root = make_user("root", is_staff=True, is_superuser=True)
        token, raw = ApiToken.objects.issue(root, "t")
        signed_in(root).post("/admin/workflows/apitoken/", {
            "action": "revoke_tokens", "_selected_action": [token.pk]})
        token.refresh_from_db()
        revoked = token.revoked_at
        assert revoked is not None
        signed_in(root).post(f"/admin/workflows/apitoken/{token.pk}/change/",
                             {"name": "t", "revoked_at_0": "", "revoked_at_1": ""})
        token.refresh_from_db()
        assert token.revoked_at == revoked
        token.revoked_at = None
        with pytest.raises(ValidationError, match="stays revoked"):
            token.save()
        assert Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/runs").status_code == 401


def test_decisions_cannot_be_deleted(waiting, people):
    engine.approve(waiting, "qa", user=people["bob"])
    decision = Approval.objects.get()
    root = make_user("root", is_staff=True, is_superuser=True)
    signed_in(root).post("/admin/workflows/approval/", {
        "action": "delete_selected", "_selected_action": [decision.pk], "post": "yes"})
    assert signed_in(root).get(f"/admin/workflows/approval/{decision.pk}/delete/"
                               ).status_code == 403
    with pytest.raises(TypeError, match="never deleted"):
        decision.delete()
    with pytest.raises(TypeError, match="never deleted"):
        Approval.objects.all().delete()
    assert Approval.objects.filter(pk=decision.pk).exists()


class TestSchedules:
    @pytest.fixture
    def specs(self, db):
        store_spec({"name": "callables", "steps": [
            {"key": "a", "run": {"callable": "workflows.callables.noop"}}]})
        store_spec({"name": "programs", "steps": [{"key": "a", "run": {"command": ["id"]}}]})

    def schedule(self, spec="callables", **fields):
        return Schedule(name=f"every-{spec}", spec_name=spec, interval_seconds=60, **fields)

    def test_scheduling_needs_add_run_checked_in_the_service(self, specs):
        sam = make_user("sam", is_staff=True)
        with pytest.raises(engine.NotPermitted, match="add_run"):
            save_schedule(self.schedule(), actor=sam)
        assert not Schedule.objects.exists()

    def test_a_program_spec_needs_author_command_spec(self, specs):
        starter = make_user("starter", perms=("add_run",))
        with pytest.raises(engine.NotPermitted, match="author_command_spec"):
            save_schedule(self.schedule("programs"), actor=starter)
        save_schedule(self.schedule(), actor=starter)
        assert Schedule.objects.count() == 1

    def test_enabling_needs_the_right_and_disabling_does_not(self, specs):
        schedule = save_schedule(self.schedule(enabled=False))  # by the system
        sam = make_user("sam", is_staff=True)
        schedule.enabled = True
        with pytest.raises(engine.NotPermitted):
            save_schedule(schedule, actor=sam)
        schedule.refresh_from_db()
        assert schedule.enabled is False
        on = save_schedule(Schedule(name="on", spec_name="callables", interval_seconds=60))
        on.enabled = False
        save_schedule(on, actor=sam)
        assert Schedule.objects.get(name="on").enabled is False

    def test_the_admin_refuses_a_staff_user_with_only_schedule_permissions(self, specs):
        sam = make_user("sam", is_staff=True, perms=("add_schedule", "view_schedule"))
        page = signed_in(sam).post("/admin/workflows/schedule/add/", {
            "name": "nightly", "spec_name": "callables", "interval_seconds": 60,
            "timezone": "UTC", "enabled": "on", "overlap": "skip", "missed": "run_once",
            "shared_state": "{}", "params": "{}", "created_at_0": "2026-12-03",
            "created_at_1": "10:00:00"})
        assert page.status_code == 200 and b"add_run" in page.content
        assert not Schedule.objects.exists()


class TestWebhookAddresses:
    @pytest.mark.parametrize("url, why", [
        ("ftp://example.com/x", "https"),
        ("http://example.com/x", "https"),
        ("https://user:pw@93.184.215.14/x", "credentials"),
        ("https://127.0.0.1/x", "loopback"),
        ("https://10.1.2.3/x", "private"),
        ("https://169.254.169.254/latest", "link-local"),
        ("https://[::1]/x", "loopback"),
        ("https://localhost/x", "loopback"),
        # IPv4 loopback inside IPv6: compatible, mapped, NAT64, 6to4.
        ("https://[::127.0.0.1]/x", "loopback"),
        ("https://[64:ff9b::7f00:1]/x", "loopback"),
        ("https://[::ffff:127.0.0.1]/x", "loopback"),
        ("https://[2002:7f00:1::1]/x", "loopback"),
        ("https://[64:ff9b::a01:203]/x", "private"),
    ])
    def test_refused_at_save(self, url, why):
        with pytest.raises(RefusedAddress, match=why):
            check_url(url)
        with pytest.raises(ValidationError):
            Webhook(group="qa", url=url, secret="s").full_clean()

    def test_a_public_https_address_is_accepted(self):
        assert check_url("https://93.184.215.14/hook") == ("93.184.215.14", 443)
        assert check_url("https://[64:ff9b::5db8:d70e]/hook")[0] == "64:ff9b::5db8:d70e"

    def test_private_addresses_and_http_hosts_by_setting(self, settings):
        settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE = True
        settings.TOLLGATE_WEBHOOK_HTTP_HOSTS = ["10.1.2.3"]
        assert check_url("http://10.1.2.3:8080/x") == ("10.1.2.3", 8080)

    def test_refused_again_at_send_time_and_only_the_code_recorded(self, waiting):
        # A row written around the form (or a setting changed since) is checked again.
        Webhook.objects.create(group="qa", url="https://127.0.0.1:9/x", secret="s")
        from workflows.models import Checkpoint

        checkpoint = Checkpoint.objects.filter(run=waiting).last()
        [delivery] = webhooks.plan(checkpoint.pk, [("gate_waiting", "qa")])
        assert webhooks.deliver(delivery) == "pending"
        record = WebhookDelivery.objects.get()
        assert record.last_error == "refused: the URL or its address is not allowed"
        assert record.last_status_code is None

    def test_the_secret_is_write_only_in_the_admin(self):
        root = make_user("root", is_staff=True, is_superuser=True)
        hook = Webhook.objects.create(group="qa", url="https://93.184.215.14/x",
                                      secret="very-secret-value")
        page = signed_in(root).get(f"/admin/workflows/webhook/{hook.pk}/change/")
        assert page.status_code == 200 and b"very-secret-value" not in page.content
        signed_in(root).post(f"/admin/workflows/webhook/{hook.pk}/change/", {
            "group": "qa", "url": "https://93.184.215.14/x", "secret": "", "active": "on"})
        hook.refresh_from_db()
        assert hook.secret == "very-secret-value"  # empty keeps it


def test_the_spec_form_shows_every_problem_and_says_which_version_it_saved(client):
    import json
    import re

    root = make_user("root", is_staff=True, is_superuser=True)
    spec = store_spec({"name": "checks", "steps": [{"key": "a"}]})[0]
    client.force_login(root)
    bad = {"max_parallel": "x", "steps": [
        {"key": "a", "max_retries": -1, "colour": 1}, {"key": "b", "depends_on": ["zz"]},
        {"key": "a"}]}
    response = client.post(f"/admin/workflows/workflowspec/{spec.pk}/change/",
                           {"definition": json.dumps(bad)})
    errors = re.findall(r"<li>(.*?)</li>", response.content.decode().split(
        'class="errorlist')[1].split("</ul>")[0])
    assert [e.split(":")[0] for e in errors] == [
        "spec", "step &#x27;a&#x27;", "step &#x27;a&#x27;", "step &#x27;a&#x27;",
        "step &#x27;b&#x27;"]
    assert any("unknown field &#x27;colour&#x27;" in e for e in errors)
    assert any("max_retries must not be negative" in e for e in errors)
    assert any("duplicate key" in e for e in errors)
    response = client.post(f"/admin/workflows/workflowspec/{spec.pk}/change/",
                           {"definition": json.dumps({"steps": [{"key": "a"}, {"key": "b"}]})},
                           follow=True)
    body = response.content.decode()
    assert "Saved &#x27;checks&#x27; as version 2, now the active one" in body
    assert "was changed successfully" not in body


def test_archiving_in_the_admin_respects_the_names_owner():
    from workflows.models import SpecOwner, WorkflowSpec

    perms = ("view_workflowspec", "change_workflowspec")
    ann, sam = (make_user(name, is_staff=True, perms=perms) for name in ("ann", "sam"))
    theirs = store_spec({"name": "payroll", "steps": [{"key": "a"}]})[0]
    SpecOwner.objects.create(name="payroll", user=ann)
    answer = signed_in(sam).post("/admin/workflows/workflowspec/", {
        "action": "archive_specs", "_selected_action": [theirs.pk]}, follow=True)
    assert "belongs to ann" in answer.content.decode()
    assert WorkflowSpec.objects.get(pk=theirs.pk).status == "active"
    signed_in(ann).post("/admin/workflows/workflowspec/", {
        "action": "archive_specs", "_selected_action": [theirs.pk]})
    assert WorkflowSpec.objects.get(pk=theirs.pk).status == "archived"


def test_a_person_who_acted_is_deactivated_not_deleted(release_spec, people):
    from django.contrib.auth.models import User

    root = make_user("root", is_staff=True, is_superuser=True)
    engine.open_run(release_spec, actor=people["alice"])
    admin = signed_in(root)
    for answer in (
            admin.post(f"/admin/auth/user/{people['alice'].pk}/delete/", {"post": "yes"}),
            admin.post("/admin/auth/user/", {"action": "delete_selected", "post": "yes",
                                             "_selected_action": [people["alice"].pk]})):
        assert answer.status_code == 200
        assert "Deactivate them instead" in answer.content.decode()
    assert User.objects.filter(pk=people["alice"].pk).exists()
    # Someone who never acted goes as before.
    admin.post(f"/admin/auth/user/{people['erin'].pk}/delete/", {"post": "yes"})
    assert not User.objects.filter(pk=people["erin"].pk).exists()

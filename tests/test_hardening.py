"""Hardening: throttled sign-in, CSP, no-store secrets, safe CSV, strict input, no 500s."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from goals.models import Goal
from workflows import engine
from workflows.models import ApiToken, Run, WorkflowSpec
from workflows.specs.validation import SpecError, validate_spec

from .conftest import make_user

pytestmark = pytest.mark.django_db


def bearer(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.objects.issue(user)[1]}")


def post_json(client, url, body: str | bytes):
    return client.post(url, body, content_type="application/json")


class TestLoginThrottling:
    def test_locked_after_repeated_failures_even_with_the_right_password(self, people):
        client = Client()
        for _ in range(4):
            response = client.post("/login/", {"username": "bob", "password": "wrong"})
            assert response.status_code == 200
        fifth = client.post("/login/", {"username": "bob", "password": "wrong"})
        assert fifth.status_code == 429
        locked = client.post("/login/", {"username": "bob", "password": "pw-bob"})
        assert locked.status_code == 429
        assert "Too many failed sign-ins" in locked.content.decode()
        assert client.get("/").status_code == 302  # still signed out

    def test_other_users_are_not_locked_out(self, people):
        client = Client()
        for _ in range(5):
            client.post("/login/", {"username": "bob", "password": "wrong"})
        response = client.post("/login/", {"username": "carol", "password": "pw-carol"})
        assert response.status_code == 302 and response["Location"] == "/"

    def test_a_success_resets_the_count(self, people):
        client = Client()
        for _ in range(4):
            client.post("/login/", {"username": "bob", "password": "wrong"})
        assert client.post("/login/", {"username": "bob", "password": "pw-bob"}).status_code == 302
        client.post("/logout/")
        for _ in range(4):
            client.post("/login/", {"username": "bob", "password": "wrong"})
        assert client.post("/login/", {"username": "bob", "password": "pw-bob"}).status_code == 302


class TestHeaders:
    def test_pages_carry_a_nonce_csp_and_htmx_uses_the_nonce(self, client, people):
        client.force_login(people["bob"])
        response = client.get("/")
        policy = response["Content-Security-Policy"]
        assert "script-src 'self' 'nonce-" in policy and "style-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
        nonce = policy.split("'nonce-")[1].split("'")[0]
        assert f'nonce="{nonce}"' in response.content.decode()

    def test_no_inline_styles_or_handlers_in_templates(self):
        from pathlib import Path

        for path in Path(__file__).resolve().parents[1].joinpath("templates").rglob("*.html"):
            text = path.read_text()
            for bad in ("style=", "onclick=", "onchange=", "onsubmit=", "<script>"):
                assert bad not in text, f"{path.name} has {bad}"

    def test_the_token_page_is_never_stored(self, client, people):
        client.force_login(people["bob"])
        response = client.post("/profile/", {"name": "ci"})
        assert "tg_" in response.content.decode()
        assert "no-store" in response["Cache-Control"]
        assert "no-store" in client.get("/profile/")["Cache-Control"]


class TestCsv:
    def test_formula_cells_are_neutralised(self, client, people):
        Goal.objects.create(title="=HYPERLINK(\"http://evil\",\"x\")", status="blocked",
                            blocker_reason="@SUM(A1)")
        Goal.objects.create(title="+1 more", status="blocked", blocker_reason="-x")
        client.force_login(people["dave"])
        response = client.get("/goals/progress/?format=csv")
        cells = [cell for row in csv.reader(io.StringIO(response.content.decode()))
                 for cell in row]
        for cell in cells:
            assert not cell.startswith(("=", "+", "-", "@")), cell
        assert "'=HYPERLINK(\"http://evil\",\"x\")" in cells

    def test_safe_cell_keeps_numbers(self):
        from tollgate.exports import safe_cell

        assert safe_cell(-3) == -3 and safe_cell("-3") == "'-3" and safe_cell("ok") == "ok"


class TestApiInput:
    @pytest.fixture
    def alice(self, people, release_spec):
        return bearer(people["alice"])

    def test_oversized_body_is_413_json(self, alice, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
        response = post_json(alice, "/api/runs", json.dumps(
            {"spec": "release", "shared_state": {"blob": "x" * 2000}}))
        assert response.status_code == 413 and "larger than 1000 bytes" in response.json()["error"]
        assert not Run.objects.exists()

    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
    def test_non_finite_numbers_are_400(self, alice, literal):
        response = post_json(alice, "/api/runs",
                             f'{{"spec": "release", "shared_state": {{"x": {literal}}}}}')
        assert response.status_code == 400 and literal in response.json()["error"]
        assert not Run.objects.exists()

    def test_deep_nesting_is_400(self, alice):
        deep = "[" * 1000 + "]" * 1000
        response = post_json(alice, "/api/runs",
                             f'{{"spec": "release", "shared_state": {{"x": {deep}}}}}')
        assert response.status_code == 400 and "nested" in response.json()["error"]
        assert not Run.objects.exists()

    def test_bad_json_is_400_json(self, alice):
        response = post_json(alice, "/api/runs", '{"spec": "release",')
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]

    def test_non_finite_state_patch_from_python_is_refused(self, release_spec, people):
        run = engine.open_run(release_spec).run
        engine.start_step(run, "build")
        with pytest.raises(engine.InvalidInput, match="state_patch.x: inf"):
            engine.complete_step(run, "build", state_patch={"x": float("inf")})
        with pytest.raises(engine.InvalidInput, match="shared_state"):
            engine.open_run(release_spec, shared_state={"x": float("nan")})

    def test_anonymous_post_is_401_not_csrf_403(self, release_spec):
        response = Client(enforce_csrf_checks=True).post(
            "/api/runs", {"spec": "release"}, content_type="application/json")
        assert response.status_code == 401 and "Authentication required" in (
            response.json()["error"])


@pytest.mark.parametrize("url", [
    "/runs/?goal=²", "/runs/?goal=99999999999999999999999", "/runs/?page=abc",
    "/goals/?owner=²", "/goals/?owner=-1", "/goals/1/children/?depth=abc",
    "/goals/1/children/?depth=²", "/runs/1/?seq=abc", "/runs/1/?seq=²",
])
def test_bad_query_numbers_never_500(client, people, release_spec, url):
    goal = Goal.objects.create(title="Root")
    run = engine.open_run(release_spec).run
    url = url.replace("/goals/1/", f"/goals/{goal.pk}/").replace("/runs/1/", f"/runs/{run.pk}/")
    client.force_login(people["dave"])
    assert client.get(url, HTTP_HX_REQUEST="true").status_code in (200, 204)
    assert client.get(url).status_code in (200, 204)


def test_admin_spec_form_refuses_a_non_object(admin_client):
    response = admin_client.post("/admin/workflows/workflowspec/add/",
                                 {"name": "x", "definition": "[1,2]"})
    assert response.status_code == 200 and "must be a JSON object" in response.content.decode()
    assert not WorkflowSpec.objects.exists()


def test_callable_allow_list_refuses_modules_and_imported_names():
    for path in ("workflows.callables.time", "workflows.callables.annotations"):
        with pytest.raises(SpecError, match="not on the allow-list"):
            validate_spec({"name": "x", "steps": [{"key": "a", "run": {"callable": path}}]})
    validate_spec({"name": "x", "steps": [{"key": "a", "run": {
        "callable": "workflows.callables.noop"}}]})


class TestAuthoringPrograms:
    def test_loading_a_shell_spec_needs_its_own_permission(self, db):
        olga = make_user("olga", perms=("add_workflowspec",))
        client = bearer(olga)
        shell = {"name": "sh", "steps": [{"key": "a", "run": {"shell": "rm -rf /tmp/x"}}]}
        response = post_json(client, "/api/specs", json.dumps(shell))
        assert response.status_code == 403 and "author_command_spec" in response.json()["error"]
        undo = {"name": "undo", "steps": [{"key": "a", "run": {"callable":
                "workflows.callables.noop"}, "compensation": {"command": ["rm", "x"]}}]}
        assert post_json(client, "/api/specs", json.dumps(undo)).status_code == 403
        fine = {"name": "fine", "steps": [{"key": "a", "run": {"callable":
                "workflows.callables.noop"}}]}
        assert post_json(client, "/api/specs", json.dumps(fine)).status_code == 201
        olga.user_permissions.add(Permission.objects.get(codename="author_command_spec"))
        assert post_json(bearer(olga), "/api/specs", json.dumps(shell)).status_code == 201


class TestConflicts:
    """A write the database refuses as conflicting (as after a restart that lost a commit's
    answer) is a 409 with a clear error, never a 500."""

    @pytest.fixture
    def conflict(self, monkeypatch):
        from django.db import IntegrityError

        def refuse(*args, **kwargs):
            raise IntegrityError("duplicate key value violates unique constraint")

        monkeypatch.setattr("workflows.engine.open_run", refuse)

    def test_the_api(self, people, release_spec, conflict):
        response = post_json(bearer(people["alice"]), "/api/runs",
                             json.dumps({"spec": "release"}))
        assert response.status_code == 409 and "nothing was changed" in response.json()["error"]

    def test_a_page(self, people, release_spec, conflict):
        client = Client(raise_request_exception=False)
        client.force_login(people["alice"])
        response = client.post("/specs/release/start/", {"title": "x"})
        assert response.status_code == 409 and b"nothing was changed" in response.content


class TestDatabaseAway:
    """With the database away, answers are 503 with Retry-After, never 500."""

    # Behind PgBouncer a dead server connection may read as InternalError.
    @pytest.fixture(params=["cut", "pooler lost its server"])
    def away(self, request, monkeypatch):
        from django.db import InternalError, OperationalError

        error = (OperationalError("server closed the connection unexpectedly")
                 if request.param == "cut"
                 else InternalError("received 2 results from command 'COMMIT'"))

        def refuse(*args, **kwargs):
            raise error

        return lambda: monkeypatch.setattr(
            "django.db.backends.utils.CursorWrapper.execute", refuse)

    def test_the_api(self, people, release_spec, away):
        alice = bearer(people["alice"])
        away()
        response = post_json(alice, "/api/runs", json.dumps({"spec": "release"}))
        assert response.status_code == 503 and response["Retry-After"] == "5"
        assert "idempotency key" in response.json()["error"]

    def test_a_page(self, people, away):
        client = Client(raise_request_exception=False)
        client.force_login(people["bob"])
        away()
        response = client.get("/")
        assert response.status_code == 503 and response["Retry-After"] == "5"


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's one writer")
@pytest.mark.django_db(transaction=True)
def test_a_writer_stopped_inside_a_write_is_answered_503_on_sqlite(people, release_spec):
    """A consumer frozen while it holds SQLite's write lock holds back every other writer:
    a press meanwhile waits out the busy timeout and answers 503, never 500, and nothing is
    half done; once the lock is let go the same press goes through."""
    import sqlite3

    run = engine.open_run(release_spec, actor=people["alice"]).run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    client = Client(raise_request_exception=False)
    client.force_login(people["bob"])
    name = connection.settings_dict["NAME"]
    connection.close()
    options = connection.settings_dict["OPTIONS"]
    options["timeout"], waited = 0.3, options["timeout"]
    holder = sqlite3.connect(name, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the frozen consumer, mid-write
    try:
        response = client.post(f"/runs/{run.pk}/steps/qa/approve/", {"comment": "ok"})
        assert response.status_code == 503 and response["Retry-After"] == "5"
        assert b"not answering" in response.content
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        connection.close()
        options["timeout"] = waited
    assert not run.steps.get(key="qa").approvals.exists()
    response = client.post(f"/runs/{run.pk}/steps/qa/approve/", {"comment": "ok"})
    assert response.status_code == 302 and run.steps.get(key="qa").approvals.exists()

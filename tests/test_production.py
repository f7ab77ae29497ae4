"""The production topology: deploy checks, gunicorn, two consumers, JSON over real HTTP."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.request

import pytest
from django.contrib.auth.models import Permission

from workflows.models import ApiToken

from .conftest import RELEASE
from .support.processes import ROOT, listener, start_gunicorn, wait_for
from .workflows.consumers import Consumer, consumer_env

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
              "ALLOWED_HOSTS": "tollgate.example.com,127.0.0.1",
              "TOLLGATE_BASE_URL": "https://tollgate.example.com"}


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    env = {**consumer_env(), **PRODUCTION, "TOLLGATE_VAR_DIR": str(tmp_path),
           "TOLLGATE_AUDIT_KEY_FILE": str(tmp_path / "keys" / "audit.pem"),
           "TOLLGATE_COMMAND_USER": "nobody",
           "TOLLGATE_VAPID_KEY_FILE": str(tmp_path / "keys" / "vapid.pem"),
           "TOLLGATE_VAPID_SUBJECT": "mailto:ops@example.com"}
    # Only what a production deployment sets: no test conveniences leak into the check.
    for name in ("TOLLGATE_SSL_REDIRECT", "TOLLGATE_SECURE_COOKIES", "TOLLGATE_EMAIL_BACKEND",
                 "DJANGO_ALLOW_ASYNC_UNSAFE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def call(url: str, token: str, data=None, method=None):
    request = urllib.request.Request(
        url, data=json.dumps(data).encode() if data is not None else None, method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.mark.consumer
@pytest.mark.django_db(transaction=True)
def test_gunicorn_and_two_consumers_run_a_release(people, tmp_path, settings):
    alice = people["alice"]
    alice.user_permissions.add(*Permission.objects.filter(
        codename__in=["add_run", "add_workflowspec", "author_command_spec"]))
    alice_token = ApiToken.objects.issue(alice)[1]
    bob_token = ApiToken.objects.issue(people["bob"])[1]
    carol_token = ApiToken.objects.issue(people["carol"])[1]
    env = {**consumer_env(), **PRODUCTION, "TOLLGATE_VAR_DIR": str(tmp_path),
           "TOLLGATE_SSL_REDIRECT": "0", "TOLLGATE_SECURE_COOKIES": "0"}
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
                   cwd=ROOT, env=env, check=True, timeout=120)
    sock = listener()
    port = sock.getsockname()[1]
    web = start_gunicorn(env, sock)
    consumers = [Consumer(workers=2, log=tmp_path / "consumers.log",
                          **{k: env[k] for k in PRODUCTION}) for _ in range(2)]
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            try:
                with urllib.request.urlopen(f"{base}/login/", timeout=2) as page:
                    return page.status == 200 and b"htmx" in page.read()
            except OSError:
                return False

        wait_for(up, 30, 0.2, what="gunicorn to serve the login page")
        with urllib.request.urlopen(f"{base}/static/django_htmx/htmx-2.min.js") as script:
            assert script.status == 200
        assert call(f"{base}/api/specs", alice_token, RELEASE)[0] == 201
        status, run = call(f"{base}/api/runs", alice_token,
                           {"spec": "release", "idempotency_key": "prod-1"})
        assert status == 201
        url = f"{base}/api/runs/{run['id']}"
        wait_for(lambda: call(url, alice_token)[1]["status"] == "waiting_approval", 30, 0.2,
                 what="the build to finish and the gate to open")
        # As a client decides: the run read first, the gate's evidence digest sent back.
        for token, body in ((bob_token, {"comment": "ok"}), (carol_token, {})):
            [gate] = [s for s in call(url, token)[1]["steps"] if s["key"] == "qa"]
            call(f"{url}/steps/qa/approve", token, {**body, "seen": gate["evidence_digest"]},
                 "POST")
        wait_for(lambda: call(url, alice_token)[1]["status"] == "completed", 30, 0.2,
                 what="deploy and notify to run")
        timeline = call(f"{url}/timeline", alice_token)[1]
        assert [c["seq"] for c in timeline] == list(range(1, len(timeline) + 1))
        workers = {c["actor"].split(":")[1] for c in timeline if c["kind"] == "step_started"}
        assert workers  # every started step names the consumer process that ran it
    finally:
        web.terminate()
        web.wait(timeout=10)
        for consumer in consumers:
            consumer.stop()


def test_check_deploy_asks_for_the_audit_key_to_be_named(tmp_path):
    env = {**consumer_env(), **PRODUCTION, "TOLLGATE_VAR_DIR": str(tmp_path)}
    for name in ("TOLLGATE_SSL_REDIRECT", "TOLLGATE_SECURE_COOKIES", "TOLLGATE_AUDIT_KEY_FILE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "tollgate.W004" in result.stdout + result.stderr


def test_check_deploy_says_who_can_read_the_audit_key(tmp_path):
    """Without a user of their own, command steps run as the consumer and can read the
    signing key; a key others can read is said too, with where it is."""
    key = tmp_path / "audit.pem"
    key.write_text("not read by the check")
    key.chmod(0o644)
    env = {**consumer_env(), **PRODUCTION, "TOLLGATE_VAR_DIR": str(tmp_path),
           "TOLLGATE_AUDIT_KEY_FILE": str(key)}
    env.pop("TOLLGATE_COMMAND_USER", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert "tollgate.W011" in said and str(key) in said
    assert "tollgate.W010" in said and "mode 644" in said

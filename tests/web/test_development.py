"""The development set-up a new user meets: `make run` on another port, readable mail with
whole links, a page of the mail sent, one log line per event."""

from __future__ import annotations

import io
import logging
import logging.config
import os
import subprocess
import sys

import pytest
from django.core.mail import EmailMessage

from workflows.delivery.mail import ReadableConsoleBackend
from workflows.models import Notification

pytestmark = pytest.mark.django_db


def test_make_run_serves_and_links_on_the_port_it_is_given():
    env = {k: v for k, v in os.environ.items() if k not in ("TOLLGATE_BASE_URL", "DEBUG")}
    out = subprocess.run(["make", "-n", "run", "PORT=8101"], capture_output=True, text=True,
                         check=True, env=env).stdout
    # A host name, which passkeys need (the README's signature walk).
    assert "Serving http://localhost:8101/ (port 8101)" in out
    assert "scripts/serve-dev localhost:8101" in out


FAKE_MANAGE = """
import pathlib, signal, sys, time
name = sys.argv[1]
def bye(signum, frame):
    pathlib.Path(name + ".stopped").write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGINT, bye)
signal.signal(signal.SIGTERM, bye)
pathlib.Path(name + ".started").touch()
while True:
    time.sleep(0.05)
"""


def test_ctrl_c_stops_the_server_and_the_consumer_together(tmp_path):
    """What `make run` runs: Ctrl-C (SIGINT to the whole group, as a terminal sends it)
    stops both children and ends cleanly, with no crash."""
    import signal
    import sys
    import time
    from pathlib import Path

    (tmp_path / "manage.py").write_text(FAKE_MANAGE)
    script = Path(__file__).resolve().parents[2] / "scripts" / "serve-dev"
    serving = subprocess.Popen([sys.executable, str(script), "127.0.0.1:8199"], cwd=tmp_path,
                               start_new_session=True)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"{n}.started").exists()
                  for n in ("run_huey", "serve_events", "runserver")):
        assert time.monotonic() < deadline and serving.poll() is None
        time.sleep(0.05)
    os.killpg(serving.pid, signal.SIGINT)
    assert serving.wait(timeout=30) == 0
    assert all((tmp_path / f"{n}.stopped").exists()
               for n in ("run_huey", "serve_events", "runserver"))

CRASHING_MANAGE = """
import pathlib, signal, sys, time
name = sys.argv[1]
starts = pathlib.Path(name + ".starts")
starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
def bye(signum, frame):
    pathlib.Path(name + ".stopped").write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGINT, bye)
signal.signal(signal.SIGTERM, bye)
if name == "run_huey" and starts.read_text() == "x":
    sys.exit(3)  # the consumer's first start fails
if name == "runserver" and pathlib.Path("web.quit").exists():
    sys.exit(4)
while True:
    time.sleep(0.05)
    if name == "runserver" and pathlib.Path("web.quit").exists():
        sys.exit(4)
"""


def test_a_helper_that_stops_is_started_again_and_the_rest_go_on(tmp_path):
    """`make run` says what runs; the consumer ending on its own is said and started again,
    the web server and the events server untouched; the web server ending ends it all."""
    import time
    from pathlib import Path

    (tmp_path / "manage.py").write_text(CRASHING_MANAGE)
    script = Path(__file__).resolve().parents[2] / "scripts" / "serve-dev"
    serving = subprocess.Popen([sys.executable, str(script), "127.0.0.1:8199"], cwd=tmp_path,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    def starts(name):
        found = tmp_path / f"{name}.starts"
        return len(found.read_text()) if found.exists() else 0

    deadline = time.monotonic() + 30
    while starts("run_huey") < 2 or starts("runserver") < 1 or starts("serve_events") < 1:
        assert time.monotonic() < deadline and serving.poll() is None
        time.sleep(0.05)
    assert (starts("runserver"), starts("serve_events")) == (1, 1)
    assert not (tmp_path / "runserver.stopped").exists()
    (tmp_path / "web.quit").touch()
    assert serving.wait(timeout=30) == 4
    out = serving.stdout.read()
    assert "the web server on http://127.0.0.1:8199/" in out
    assert "the events server on http://127.0.0.1:8200/" in out
    assert "the Huey consumer stopped (exit 3); started again" in out
    assert "the web server stopped (exit 4): stopping the rest." in out
    assert (tmp_path / "run_huey.stopped").exists()
    assert (tmp_path / "serve_events.stopped").exists()


def test_demo_prints_the_base_url(settings):
    from django.core.management import call_command

    settings.TOLLGATE_BASE_URL = "http://127.0.0.1:8101"
    out = io.StringIO()
    call_command("demo", stdout=out)
    assert "Sign in at http://127.0.0.1:8101/ as:" in out.getvalue()


def test_console_mail_keeps_each_link_whole_on_its_line():
    link = "http://127.0.0.1:8101/decide/" + "a" * 120 + "/"
    stream = io.StringIO()
    ReadableConsoleBackend(stream=stream).send_messages([EmailMessage(
        "Gate waiting: QA sign-off", f"Decide here:\n{link}\n", "tollgate@localhost",
        ["bob@example.com"])])
    text = stream.getvalue()
    assert f"\n{link}\n" in text and "=\n" not in text
    assert "Subject: Gate waiting: QA sign-off" in text and "To: bob@example.com" in text


def test_the_mail_page_exists_with_debug_only(client, people, settings):
    Notification.objects.create(user=people["bob"], key="k", event="gate_waiting",
                                subject="Gate waiting", body="Decide: http://x.example/d/1/")
    client.force_login(people["bob"])
    settings.DEBUG = False
    assert client.get("/dev/mail/").status_code == 404
    settings.DEBUG = True
    body = client.get("/dev/mail/").content.decode()
    assert "Gate waiting" in body and '<a href="http://x.example/d/1/"' in body


def test_a_huey_log_line_is_written_once_and_routine_ones_not_at_info(capsys):
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    logger = logging.getLogger("huey.consumer")
    assert logging.getLogger("huey").handlers  # so run_huey adds none of its own
    logger.info("Huey consumer started with 2 thread")
    logger.info("Enqueueing periodic task sweep.")
    logging.getLogger("huey").info("Executing %s", "workflows.tasks.sweep")
    err = capsys.readouterr().err
    assert err.count("Huey consumer started") == 1
    assert "Enqueueing periodic task" not in err and "Executing" not in err


def test_a_refusal_is_logged_once_without_a_traceback(client, people, capsys):
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    client.force_login(people["bob"])
    assert client.get("/workers/").status_code == 403
    err = capsys.readouterr().err
    assert err.count("Forbidden") == 1 and "Traceback" not in err


def test_the_readme_api_walk_through_works_against_the_demo_data(db):
    """The README's curl lines, in order, on a fresh demo."""
    import json

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    from workflows.models import ApiToken

    call_command("demo", stdout=io.StringIO())
    _, token = ApiToken.objects.issue(User.objects.get(username="alice"), "release-bot")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    started = api.post("/api/runs", {"spec": "data-release",
                                     "idempotency_key": "nightly-2026-12-03"},
                       content_type="application/json")
    assert started.status_code == 201, started.json()
    run = started.json()["id"]
    resume = api.get(f"/api/runs/{run}/resume").json()
    assert resume["next_step"] == "snapshot" and resume["can_resume"] is True
    reported = api.post(f"/api/runs/{run}/transition", json.dumps({
        "step": "snapshot", "step_status": "completed", "summary": "snapshot of 3 Dec ready",
        "state_patch": {"snapshot": "2026-12-03"}}), content_type="application/json")
    assert reported.status_code == 200 and reported.json()["run"]["shared_state"] == {
        "snapshot": "2026-12-03"}


def test_log_lines_name_the_run_step_and_attempt_and_can_be_json(capsys, settings):
    import json

    from tollgate import logs

    config = {**settings.LOGGING}
    logging.config.dictConfig(config)
    log = logging.getLogger("workflows.workers.worker")
    with logs.about(run=7, step="build", attempt=2):
        log.warning("Attempt failed in the worker")
    assert "[run 7 step build attempt 2]: Attempt failed" in capsys.readouterr().err
    config["handlers"] = {"console": {**config["handlers"]["console"], "formatter": "json"}}
    logging.config.dictConfig(config)
    with logs.about(run=7, step="build", attempt=2):
        log.warning("Attempt failed in the worker")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["run"] == 7 and line["step"] == "build" and line["attempt"] == 2
    assert line["message"] == "Attempt failed in the worker" and line["level"] == "WARNING"
    logging.config.dictConfig(settings.LOGGING)


def test_commands_start_without_the_axes_banner():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True,
                          text=True, env=env, check=True)
    assert "AXES: BEGIN" not in done.stdout + done.stderr


def test_tracing_records_requests_and_worker_attempts(release_spec, monkeypatch):
    """With the otel extra on, a request and a worker's attempt are spans."""
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tollgate import tracing
    from workflows import engine
    from workflows.engine import processes
    from workflows.workers import worker

    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", trace.Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    spans = InMemorySpanExporter()
    tracing.setup(exporter=spans)
    try:
        from django.test import Client

        assert Client().get("/healthz").status_code == 200
        run = engine.open_run(release_spec).run
        step = engine.claim_next(owner="w", lease_seconds=30, holder=processes.this_process())
        worker._execute_one(step, "w", chain=False)
    finally:
        DjangoInstrumentor().uninstrument()
        monkeypatch.setattr(tracing, "_tracer", None)
    names = [span.name for span in spans.get_finished_spans()]
    assert any("healthz" in name or name.startswith("GET") for name in names), names
    attempt = next(s for s in spans.get_finished_spans() if s.name == "tollgate.attempt")
    assert attempt.attributes["tollgate.run_id"] == run.pk
    assert attempt.attributes["tollgate.step"] == "build"


def test_the_mail_page_shows_each_person_their_own_mail_and_staff_all(client, people,
                                                                      settings):
    from tests.conftest import make_user

    settings.DEBUG = True
    Notification.objects.create(user=people["bob"], key="b", event="gate_waiting",
                                subject="For bob", body="http://x.example/d/bob/")
    Notification.objects.create(user=people["carol"], key="c", event="gate_waiting",
                                subject="For carol", body="http://x.example/d/carol/")
    client.force_login(people["bob"])
    body = client.get("/dev/mail/").content.decode()
    assert "For bob" in body and "For carol" not in body and "/d/carol/" not in body
    client.force_login(make_user("sam", is_staff=True))
    body = client.get("/dev/mail/").content.decode()
    assert "For bob" in body and "For carol" in body


def test_the_demo_has_a_signed_gate_a_release_manager_signs_with_her_password(db, client):
    """The README's signature walk on `make run`'s data: carol, a release manager, signs the
    demo's hotfix with her demo password."""
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from workflows.management.commands.demo import PASSWORD
    from workflows.models import Approval, Run

    call_command("demo", stdout=io.StringIO())
    run = Run.objects.get(title="Hotfix 1.0.1")
    gate = run.steps.get(key="signoff")
    client.force_login(User.objects.get(username="carol"))
    inbox = client.get("/").content.decode()
    assert "Release manager sign-off" in inbox and "Approved for production" in inbox
    client.post(f"/runs/{run.pk}/steps/signoff/approve/", {
        "comment": "smallest fix", "signature_password": PASSWORD,
        "evidence_digest": gate.evidence_digest})
    decision = Approval.objects.get(step=gate)
    assert (decision.user.username, decision.signature_meaning,
            decision.signature_method) == ("carol", "Approved for production", "password")

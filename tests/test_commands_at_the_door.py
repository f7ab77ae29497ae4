"""Every management command the guides name, run as a person runs it: `python manage.py NAME`
in a shell, on a database of its own. `call_command` skips what the command line does first
(the system checks, the argument parser), which is where `verify_audit` once crashed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands

from tests.support.processes import ROOT, listener, port_open, stop, wait_for

COMMANDS = sorted(p.stem for p in (ROOT / "workflows" / "management" / "commands").glob("*.py")
                  if not p.stem.startswith("_"))


def a_shell(var: Path):
    """`python manage.py ...` on a fresh SQLite database of its own in `var`, migrated and
    with the demo's people and runs; returns (exit code, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TOLLGATE_"))}
    env.update(DJANGO_SETTINGS_MODULE="tollgate.settings", DEBUG="0",
               TOLLGATE_VAR_DIR=str(var), DATABASE_URL=f"sqlite:///{var / 'door.sqlite3'}",
               TOLLGATE_DISPATCH="0", PROMETHEUS_MULTIPROC_DIR=str(var / "metrics"))
    env.pop("TOLLGATE_REDIS_URL", None)

    def run(*args: str, stdin: str | None = None) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300, input=stdin)
        return done.returncode, done.stdout + done.stderr

    run.env = env
    assert run("migrate", "--noinput", "-v0")[0] == 0
    code, out = run("demo")
    assert code == 0, out
    return run


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    return a_shell(tmp_path_factory.mktemp("door"))


def ok(result: tuple[int, str]) -> str:
    code, out = result
    assert code == 0, out
    return out


def waiting_run(shell, spec: str) -> int:
    out = ok(shell("runs", "--status", "waiting_approval", "--spec", spec))
    return int(re.search(rf"^\s*(\d+)\s+waiting_approval\s+{spec} ", out, re.M)[1])


def test_the_guides_name_every_command_and_each_command_they_show_is_run_here():
    guides = "\n".join(path.read_text() for path in [ROOT / "README.md",
                                                    *sorted((ROOT / "docs").glob("*.md"))])
    named = set(re.findall(r"manage\.py (\w+)", guides))
    ours = set(COMMANDS) - {"flush"}  # Django's own, guarded: said where it is refused
    assert ours <= named, f"commands the guides do not name: {ours - named}"
    # Each command a guide shows is one of ours (run below) or one of Django's own.
    django_own = set(get_commands())
    assert named <= set(COMMANDS) | django_own, named - set(COMMANDS) - django_own
    tested = {name for found in re.findall(r'(?:shell|run)\("(\w+)"|"manage.py", "(\w+)"',
                                           Path(__file__).read_text())
              for name in found if name}
    assert set(COMMANDS) <= tested, f"commands not run here: {set(COMMANDS) - tested}"


def test_loading_starting_listing_and_reading_runs(shell, tmp_path):
    assert "release v" in ok(shell("load_workflow", "examples/release.json"))
    assert "release-eu v1" in ok(shell("load_workflow", "examples/release.json",
                                       "--name", "release-eu"))
    assert "release" in ok(shell("specs"))
    first = ok(shell("start_run", "release", "--idempotency-key", "nightly-1",
                     "--state", '{"branch": "main"}')).strip()
    again = ok(shell("start_run", "release", "--idempotency-key", "nightly-1"))
    assert f"Reused run {first.split()[0]}" in again
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"key": "look", "title": "Look"}]))
    assert ok(shell("start_run", "adhoc", "--steps", str(steps), "--ref", "TICKET-42",
                    "--kind", "agent")).strip()
    assert "release" in ok(shell("runs", "--spec", "release"))
    run = first.split()[0]
    assert "next step: build" in ok(shell("resume", run))
    assert ok(shell("resume", run, "--timeline", "20"))
    assert ok(shell("transition", run, "--summary", "a note from the shell"))
    assert ok(shell("recover", run)) is not None


def test_deciding_who_decides_and_tokens(shell):
    run = waiting_run(shell, "release")
    out = ok(shell("reassign", str(run), "qa", "--person", "carol", "--reason",
                   "bob is on leave"))
    assert "carol" in out
    code, out = shell("reassign", str(run), "qa", "--person", "nobody", "--reason", "x")
    assert code != 0 and "nobody" in out and "Traceback" not in out
    token = ok(shell("create_token", "alice", "--name", "ci")).strip()
    assert len(token) >= 20


def test_the_verifier_runs_from_the_command_line(shell):
    out = ok(shell("verify_audit"))
    assert out.startswith("Verified") and "holds" in out
    run = waiting_run(shell, "release")
    assert ok(shell("verify_audit", str(run))).startswith("Verified")


def test_pruning_and_flushing(tmp_path):
    shell = a_shell(tmp_path)
    out = ok(shell("prune_runs", "--older-than", "30", "--dry-run"))
    assert "Traceback" not in out
    ok(shell("flush", "--noinput"))  # on SQLite past the audit's refusal of DELETE, as asked
    assert ok(shell("verify_audit")).startswith("Verified 0 run(s)")


def test_the_long_running_commands_start_and_stop(shell):
    sock = listener()
    port = sock.getsockname()[1]
    sock.close()  # serve_events binds the address it is given, as a person gives it
    server = subprocess.Popen([sys.executable, "manage.py", "serve_events",
                               f"127.0.0.1:{port}"], cwd=ROOT, env=shell.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open(port) or server.poll() is not None,
                 what="serve_events to listen")
        assert server.poll() is None
    finally:
        stop(server, sig=15)
    assert "run_huey" in ok(shell("help", "run_huey"))


def test_a_consumer_whose_commands_could_read_the_signing_key_does_not_start(shell):
    code, out = shell("run_huey")  # no TOLLGATE_COMMAND_USER, not DEBUG
    assert code != 0 and "TOLLGATE_COMMAND_USER" in out and "signing key" in out
    assert "Traceback" not in out
    # Taking the risk knowingly, it starts (and stops on SIGINT).
    consumer = subprocess.Popen([sys.executable, "manage.py", "run_huey", "--workers", "1"],
                                cwd=ROOT, env={**shell.env, "TOLLGATE_COMMANDS_AS_CONSUMER": "1",
                                               "LOG_LEVEL": "INFO"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        wait_for(lambda: said.append(consumer.stdout.readline()) or "started" in said[-1]
                 or consumer.poll() is not None, what="the consumer to start")
        assert consumer.poll() is None, "".join(said)
    finally:
        stop(consumer, sig=2)


REPLY_DOMAIN = "reply.tollgate.example.org"
GATE_FOR_CAROL = """
from django.contrib.auth.models import User
from workflows.delivery import links
from workflows.models import Step
from workflows.people.permissions import deciders
carol = User.objects.get(username="carol")
gate = next(s for s in Step.objects.filter(status="waiting_approval").select_related("run")
            if deciders(s.run, s).filter(pk=carol.pk).exists()
            and not s.config["approval"].get("form") and not s.config["approval"].get("signature"))
print(gate.pk, links.reply_address(carol, gate))
"""


def test_a_reply_through_the_mail_server_decides_and_a_database_away_is_retried(shell,
                                                                              tmp_path):
    """A mail server (aiosmtpd) pipes each reply to `manage.py receive_mail`, as Postfix's
    pipe transport does: carol's signed reply approves her gate; with the database away
    the command exits 75 and the server answers 451, so the sender's server tries again.
    (Last in this module: the gate it decides is no other test's.)"""
    from tests.support import mail

    records = tmp_path / "dkim.json"
    mail.reply("x@example.org", "carol@example.com", "approve")  # makes example.com's key
    mail.publish(records)
    shell.env.update(TOLLGATE_REPLY_DOMAIN=REPLY_DOMAIN,
                     TOLLGATE_TEST_DKIM_RECORDS=str(records),
                     TOLLGATE_DKIM_DNS="tests.support.mail.dns_txt")
    step, address = ok(shell("shell", "-c", GATE_FOR_CAROL)).split()[-2:]
    reply = mail.reply(address, "Carol <carol@example.com>", "approve\nchecked the numbers")
    server = mail.PipingMailServer([sys.executable, "manage.py", "receive_mail"],
                                   shell.env, ROOT)
    try:
        away = {**shell.env, "DATABASE_URL": "postgres://tollgate@127.0.0.1:9/none"}
        server.env = away
        refused = server.send(reply, "carol@example.com", address)
        assert refused is not None and refused.smtp_code == 451, server.answers
        assert server.answers[-1][0] == 75, server.answers
        server.env = shell.env
        assert server.send(reply, "carol@example.com", address) is None, server.answers
        assert "\ndecided: You approved" in server.answers[-1][1], server.answers
    finally:
        server.close()
    recorded = ok(shell("shell", "-c", f"""
from workflows.models import Approval
a = Approval.objects.get(step_id={step}, user__username="carol")
print(a.decision, a.channel, a.comment)""")).splitlines()[-1]
    assert recorded == "approve mail_reply checked the numbers", recorded
    # The mail server delivering it once more (a retry after a lost answer) decides nothing.
    code, out = shell("receive_mail", "--recipient", address, stdin=reply.decode())
    assert code == 0 and "a replay" in out, out
    code, out = shell("receive_mail", stdin="no mail at all")
    assert code == 65 and "no mail message" in out, out

"""Secrets stay with the worker: named secrets resolved on it, a clean supervisor, redacted
patches, masked inline values, and commands run as another account."""

from __future__ import annotations

import json
import os
import pwd
import tempfile
import threading
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import make_user
from workflows.models import ApiToken
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError
from workflows.workers.executors import run_process

CONTEXT = {"run_id": 7, "step_key": "deploy", "attempt": 1}


def run(action, state=None):
    return run_process(action, context=CONTEXT, shared_state=state or {},
                       stop=threading.Event(), grace=1.0)


def test_the_supervisor_does_not_carry_the_workers_environment(monkeypatch):
    monkeypatch.setenv("WORKER_ONLY_PASSWORD", "hunter2-of-the-worker")
    monkeypatch.setenv("WORKER_ONLY_NOTE", "plain-worker-note")
    outcome = run({"shell": 'tr "\\0" "\\n" < /proc/$PPID/environ; echo "mine=$WORKER_ONLY_NOTE"'})
    assert outcome.ok, outcome.summary
    out = outcome.evidence["stdout"]
    assert "TOLLGATE_STEP_KEY=deploy" in out  # it reads the supervisor's: the clean one
    assert "plain-worker-note" not in out and "hunter2" not in out


def test_a_path_to_a_secret_is_not_a_secret_but_the_secret_is(monkeypatch):
    """TOLLGATE_AUDIT_KEY_FILE names where the key is: its path's pieces ("tollgate") are
    ordinary words and stay in the output; a KEY variable's value is still redacted."""
    monkeypatch.setenv("TOLLGATE_AUDIT_KEY_FILE", "/etc/tollgate/audit/audit-key.pem")
    monkeypatch.setenv("WORKER_DEPLOY_KEY", "k3y-of-the-deploys")
    outcome = run({"shell": 'echo "I am tollgate-steps"; echo "k3y-of-the-deploys"'})
    assert outcome.ok, outcome.summary
    assert outcome.evidence["stdout"] == "I am tollgate-steps\n[redacted]\n"


@pytest.fixture
def granted(settings):
    """Every spec may name the secrets these tests use."""
    settings.TOLLGATE_SECRET_GRANTS = {"*": ["deploy", "db.password", "db_url", "nowhere"]}


def test_a_named_secret_is_resolved_on_the_worker_and_redacted_everywhere(monkeypatch, granted):
    monkeypatch.setenv("TOLLGATE_SECRET_DEPLOY", "s3cr3t-deploy-value")
    outcome = run({"shell": 'echo "token=$DEPLOY_TOKEN"; '
                            'printf \'{"used": "%s", "%s": 1}\' "$DEPLOY_TOKEN" "$DEPLOY_TOKEN" '
                            '> "$TOLLGATE_STATE_PATCH_FILE"',
                   "env": {"DEPLOY_TOKEN": {"secret": "deploy"}}})
    assert outcome.ok, outcome.summary
    assert outcome.evidence["stdout"] == "token=[redacted]\n"
    assert outcome.state_patch == {"used": "[redacted]", "[redacted]": 1}


def test_a_secret_from_the_secrets_folder(settings, tmp_path, granted):
    (tmp_path / "db.password").write_text("from-a-file-123\n")
    settings.TOLLGATE_SECRETS_DIR = str(tmp_path)
    outcome = run({"command": ["sh", "-c", 'test "$PW" = from-a-file-123 && echo same'],
                   "env": {"PW": {"secret": "db.password"}}})
    assert outcome.ok and outcome.evidence["stdout"] == "same\n"


def test_a_missing_secret_fails_the_step_saying_where_it_was_looked_for(settings, granted):
    settings.TOLLGATE_SECRETS_DIR = ""
    outcome = run({"command": ["true"], "env": {"X": {"secret": "nowhere"}}})
    assert not outcome.ok
    assert "Secret 'nowhere' is not set on this worker (TOLLGATE_SECRET_NOWHERE" in outcome.summary


FILE_SECRET = "pg://app:Xq7-v93Lk-2mRt@db.internal/app"


@pytest.mark.parametrize("printed", [
    'echo "$DB_URL"',  # as it is, under a name with no TOKEN, SECRET, PASSWORD or KEY in it
    'printf %s "$DB_URL" | base64 -w0',
    'printf "prefix:%s" "$DB_URL" | base64 -w0',  # base64 of a longer text, shifted
    'printf %s "$DB_URL" | base64 -w0 | tr "+/" "-_" | tr -d =',  # URL-safe, unpadded
    'printf %s "$DB_URL" | od -An -tx1 | tr -d " \n"',  # hex
    'python3 -c "import os,urllib.parse;print(urllib.parse.quote(os.environ[\'DB_URL\'],\'\'))"',
    'printf %s "$DB_URL" | rev',
    'printf %s "$DB_URL" | cut -c5-20',  # a piece of it
])
def test_a_file_secret_is_redacted_by_value_in_every_form(settings, tmp_path, granted,
                                                          printed):
    (tmp_path / "db_url").write_text(FILE_SECRET + "\n")
    settings.TOLLGATE_SECRETS_DIR = str(tmp_path)
    outcome = run({"shell": f"{printed}; echo; {printed} >&2; "
                            f'printf \'{{"seen": "%s"}}\' "$({printed})" '
                            '> "$TOLLGATE_STATE_PATCH_FILE"',
                   "env": {"DB_URL": {"secret": "db_url"}}})
    assert outcome.ok, outcome.summary
    stored = json.dumps([outcome.evidence, outcome.state_patch])
    assert "[redacted]" in outcome.evidence["stdout"], outcome.evidence["stdout"]
    assert "[redacted]" in outcome.state_patch["seen"]
    for form in ("Xq7-v93Lk-2mRt", "db.internal/app", "app:Xq7"):
        assert form not in stored
    assert "Xq7-v93Lk-2mRt"[::-1] not in stored


@pytest.mark.parametrize("printed", [
    'printf "token: %s" "$DB_URL" | gzip | base64 -w0',  # compressed, then base64
    'printf "token: %s" "$DB_URL" | gzip | base64 -w 20',  # and wrapped on short lines
    'printf %s "$DB_URL" | base32 -w0',
    'printf "ab%s" "$DB_URL" | base32 -w0',  # base32 of a longer text, shifted
    'printf %s "$DB_URL" | od -An -tx1',  # hex, spaced and on several lines
    'printf %s "$DB_URL" | fold -w 3',  # cut into lines shorter than any piece
    'printf %s "$DB_URL" | tr A-Za-z N-ZA-Mn-za-m',  # rot13
    'python3 -c \'import os; print("".join("\\\\u%04x" % ord(c) '
    'for c in os.environ["DB_URL"]))\'',  # every character \u-escaped
])
def test_a_file_secret_is_redacted_in_the_encodings_a_leak_would_use(settings, tmp_path,
                                                                     granted, printed):
    (tmp_path / "db_url").write_text(FILE_SECRET + "\n")
    settings.TOLLGATE_SECRETS_DIR = str(tmp_path)
    outcome = run({"shell": f"echo start; {printed}; echo end",
                   "env": {"DB_URL": {"secret": "db_url"}}})
    assert outcome.ok, outcome.summary
    stdout = outcome.evidence["stdout"]
    assert "[redacted]" in stdout and "start" in stdout and "end" in stdout, stdout
    for form in ("Xq7-v93Lk-2mRt", "db.internal/app", "app:Xq7"):
        assert form not in "".join(stdout.split())


def test_a_callable_cannot_return_a_secret_of_the_folder_either(settings, tmp_path):
    from workflows.workers.executors import run_callable

    (tmp_path / "db_url").write_text(FILE_SECRET)
    settings.TOLLGATE_SECRETS_DIR = str(tmp_path)
    settings.TOLLGATE_CALLABLES = ["tests.callables.*"]
    outcome = run_callable({"callable": "tests.callables.echo_state"}, context=CONTEXT,
                           shared_state={"leak": FILE_SECRET})
    assert outcome.ok and FILE_SECRET not in json.dumps(outcome.state_patch)


def test_a_spec_names_only_the_secrets_granted_to_it(db, settings, monkeypatch):
    settings.TOLLGATE_SECRET_GRANTS = {"release-*": ["deploy"], "data": ["warehouse.*"]}
    step = {"key": "d", "run": {"command": ["true"], "env": {"T": {"secret": "deploy"}}}}
    store_spec({"name": "release-web", "steps": [step]})
    store_spec({"name": "data", "steps": [
        {**step, "run": {**step["run"], "env": {"W": {"secret": "warehouse.ro"}}}}]})
    with pytest.raises(SpecError, match="step 'd' run env T: secret 'deploy' is not granted "
                                        "to spec 'data'"):
        store_spec({"name": "data", "steps": [step]})
    # The worker checks again: a grant withdrawn after the spec was stored holds too.
    monkeypatch.setenv("TOLLGATE_SECRET_DEPLOY", "s3cr3t-deploy-value")
    settings.TOLLGATE_SECRET_GRANTS = {}
    outcome = run_process({"command": ["true"], "env": {"T": {"secret": "deploy"}}},
                          context={**CONTEXT, "spec": "release-web"}, shared_state={},
                          stop=threading.Event(), grace=1.0)
    assert not outcome.ok and "not granted to spec 'release-web'" in outcome.summary


def test_a_granted_name_is_written_only_by_whom_it_belongs_to(db, settings):
    """The grant binds the spec name, and the name binds its authors: mallory (an author
    too) cannot reach the deploy secret by loading a version of alice's spec, running it
    inline, or adding a step to a run of it."""
    from django.contrib.auth.models import Group

    from tests.conftest import make_user
    from workflows import engine
    from workflows.errors import NotPermitted
    from workflows.models import SpecOwner
    from workflows.specs.storage import store_one_off

    settings.TOLLGATE_SECRET_GRANTS = {"release-*": ["deploy"]}
    perms = ("add_workflowspec", "author_command_spec", "add_run", "operate_run")
    alice, mallory = make_user("alice", perms=perms), make_user("mallory", perms=perms)
    step = {"key": "d", "run": {"command": ["true"], "env": {"T": {"secret": "deploy"}}}}
    # A fresh name the grant covers is nobody's to claim by loading it first.
    harmless = {"key": "d", "run": {"command": ["true"]}}
    for author in (mallory, alice):
        with pytest.raises(NotPermitted, match="only an admin can give it an owner"):
            store_spec({"name": "release-web", "steps": [harmless]}, actor=author)
    assert not SpecOwner.objects.filter(name="release-web").exists()
    store_spec({"name": "notes", "steps": [harmless]}, actor=mallory)  # no grant: hers
    SpecOwner.objects.create(name="release-web", user=alice)  # an admin gives it to alice
    store_spec({"name": "release-web", "steps": [step]}, actor=alice)
    leak = {"key": "leak", "run": {"command": ["env"], "env": {"T": {"secret": "deploy"}}}}
    with pytest.raises(NotPermitted, match="belongs to alice"):
        store_spec({"name": "release-web", "steps": [leak]}, actor=mallory)
    with pytest.raises(NotPermitted, match="belongs to alice"):
        store_one_off({"name": "release-web", "steps": [leak]}, actor=mallory)
    run = engine.open_run("release-web", actor=mallory).run
    with pytest.raises(NotPermitted, match="belongs to alice"):
        engine.add_steps(run, [{**leak, "depends_on": []}], actor=mallory)
    assert not run.steps.filter(key="leak").exists()
    # A name the system loaded is the admins' until an admin gives it to someone.
    store_spec({"name": "release-api", "steps": [step]})
    with pytest.raises(NotPermitted, match="belongs to the admins"):
        store_spec({"name": "release-api", "steps": [leak]}, actor=alice)
    # An admin gives alice's name to a group mallory is in: now she may.
    team = Group.objects.create(name="release-authors")
    mallory.groups.add(team)
    SpecOwner.objects.filter(name="release-web").update(group=team)
    assert store_spec({"name": "release-web", "steps": [step, {**leak, "key": "e"}]},
                      actor=mallory)[1]


@pytest.mark.parametrize("value, problem", [
    ({"secret": "a b"}, "a secret is"),
    ({"secret": "x", "default": "y"}, "a secret is"),
    (3, "must be a string"),
])
def test_bad_env_values_are_refused_naming_the_step(db, value, problem):
    with pytest.raises(SpecError, match=f"step 'd' run env X: {problem}"):
        store_spec({"name": "s", "steps": [{"key": "d", "run": {"command": ["true"],
                                                                 "env": {"X": value}}}]})


@pytest.mark.django_db
def test_inline_values_are_masked_for_those_who_may_not_change_specs(client, granted):
    store_spec({"name": "deploy", "steps": [{"key": "d", "run": {
        "command": ["true"], "env": {"REGION": "eu-west-1", "TOKEN": {"secret": "deploy"}}}}]})
    reader = make_user("reader")
    editor = make_user("editor", perms=("change_workflowspec",))

    def env_seen(user):
        token = ApiToken.objects.issue(user, "t")[1]
        body = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/specs/deploy").json()
        return body["versions"][0]["definition"]["steps"][0]["run"]["env"]

    assert env_seen(reader) == {"REGION": "[masked]", "TOKEN": {"secret": "deploy"}}
    assert env_seen(editor) == {"REGION": "eu-west-1", "TOKEN": {"secret": "deploy"}}
    staff = make_user("staff", is_staff=True, perms=("view_workflowspec",))
    client.force_login(staff)
    from workflows.models import WorkflowSpec

    page = client.get(f"/admin/workflows/workflowspec/{WorkflowSpec.objects.get().pk}/change/")
    assert page.status_code == 200
    assert "eu-west-1" not in page.content.decode() and "[masked]" in page.content.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="running a command as another account needs root")
def test_a_command_run_as_another_account_cannot_reach_the_worker(settings, monkeypatch):
    settings.TOLLGATE_COMMAND_USER = "nobody"
    monkeypatch.setenv("WORKER_ONLY_PASSWORD", "hunter2-of-the-worker")
    private = Path(tempfile.mkdtemp())
    private.chmod(0o755)
    (private / "secret_key").write_text("the-signing-key")
    (private / "secret_key").chmod(0o600)
    try:
        outcome = run({"shell": f'id -u; cat /proc/{os.getpid()}/environ; '
                                f'cat {private}/secret_key; cat "$TOLLGATE_STATE_FILE"; '
                                'echo \'{"ran": true}\' > "$TOLLGATE_STATE_PATCH_FILE"'},
                      state={"branch": "main"})
    finally:
        (private / "secret_key").unlink()
        private.rmdir()
    out, err = outcome.evidence["stdout"], outcome.evidence["stderr"]
    assert out.splitlines()[0] == str(pwd.getpwnam("nobody").pw_uid)
    assert "hunter2" not in out and "the-signing-key" not in out
    assert "Permission denied" in err
    assert json.loads(out.splitlines()[1])["branch"] == "main"  # its own files it reads
    assert outcome.state_patch == {"ran": True}  # and writes

"""The audit chain: what a database user changes behind the application's back is named by
`manage.py verify_audit` (run and seq), and an exported timeline verifies offline."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import Client

from workflows import engine
from workflows.audit import seals
from workflows.audit.verify import verify
from workflows.models import ApiToken, AuditSeal, Checkpoint

from ..support.processes import ROOT

pytestmark = pytest.mark.django_db


@pytest.fixture
def decided(waiting, people):
    """A run whose build ran and whose QA gate bob approved: six checkpoints or so."""
    engine.approve(waiting, "qa", user=people["bob"], comment="looks good")
    return waiting


def raw(sql: str, params=()) -> None:
    """SQL as a database administrator runs it: the append-only triggers disabled first
    (PostgreSQL: replication role; SQLite: the trigger dropped, then made again)."""
    from importlib import import_module

    triggers = [import_module("workflows.migrations.0044_append_only_audit"),
                import_module("workflows.migrations.0050_audit_timestamps"),
                import_module("workflows.migrations.0051_sqlite_refuses_audit_deletes"),
                import_module("workflows.migrations.0058_decisions_append_only")]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute(sql, params)
            return
        for statement in [s for module in triggers for s in module.SQLITE_DROP]:
            cursor.execute(statement)
        cursor.execute(sql, params)
        for statement in [s for module in triggers for s in module.SQLITE]:
            cursor.execute(statement)


def test_the_database_refuses_changes_to_the_trail(decided):
    seals.seal()
    refused = [("UPDATE workflows_checkpoint SET summary = 'x' WHERE run_id = %s", decided.pk),
               ("UPDATE workflows_auditseal SET hash = 'x' WHERE run_id = %s", decided.pk),
               ("DELETE FROM workflows_checkpoint WHERE run_id = %s", decided.pk),
               ("DELETE FROM workflows_auditseal WHERE run_id = %s", decided.pk)]
    for sql, run_id in refused:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [run_id])
    assert verify().ok


def named(run, seq: int) -> str:
    with pytest.raises(CommandError) as failed:
        call_command("verify_audit")
    assert f"the first: run {run.pk} seq {seq}" in str(failed.value)
    found = verify().problems
    assert [(run_id, at) for run_id, at, _ in found] == [(run.pk, seq)], found
    return found[0][2]


def test_every_transition_extends_its_runs_chain(decided, capsys):
    rows = list(Checkpoint.objects.filter(run=decided).order_by("seq"))
    assert len(rows) >= 4 and rows[0].prev_hash == ""
    assert all(later.prev_hash == earlier.hash
               for earlier, later in zip(rows, rows[1:], strict=False))
    decided.refresh_from_db()
    assert decided.chain_head == rows[-1].hash
    call_command("verify_audit")
    assert "every chain, decision, seal and timestamp holds" in capsys.readouterr().out


def test_a_summary_rewritten_by_sql_is_named(decided):
    raw("UPDATE workflows_checkpoint SET summary = 'nothing to see' "
        "WHERE run_id = %s AND seq = 2", [decided.pk])
    assert "do not match its hash" in named(decided, 2)


def test_a_rewritten_decision_is_named(decided):
    """The approval's checkpoint carries who decided: changing it is found."""
    seq = Checkpoint.objects.get(run=decided, kind="approval_recorded").seq
    raw("UPDATE workflows_checkpoint SET actor_name = 'carol' WHERE run_id = %s AND seq = %s",
        [decided.pk, seq])
    assert "do not match its hash" in named(decided, seq)


def test_the_database_refuses_changes_to_a_decision(decided):
    """A decision row is the trail too: no UPDATE, and no DELETE outside retention (on
    PostgreSQL a session's own setting no longer lets it through)."""
    refused = ["UPDATE workflows_approval SET comment = 'x'", "DELETE FROM workflows_approval"]
    if connection.vendor == "postgresql":
        refused.append("SELECT set_config('tollgate.retention', 'on', true); "
                       "DELETE FROM workflows_approval")
    for sql in refused:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql)
    assert verify().ok


@pytest.mark.parametrize("sql, what", [
    ("UPDATE workflows_approval SET comment = 'ship v2 instead'", "differs from what"),
    ("UPDATE workflows_approval SET signature_meaning = 'Approved for release'",
     "differs from what"),
    ("DELETE FROM workflows_approval", "is gone"),
])
def test_a_decision_changed_or_deleted_by_sql_is_named(decided, sql, what):
    """Who decided, what they wrote and how they signed are in the decision's row, which
    the export, the CSV and My decisions read: the row's digest is in its checkpoint."""
    seq = Checkpoint.objects.get(run=decided, kind="approval_recorded").seq
    raw(sql)
    assert what in named(decided, seq)


def test_a_decision_added_by_sql_is_named(decided, people):
    from workflows.models import Approval

    row = Approval.objects.values().get()
    raw("INSERT INTO workflows_approval (step_id, attempt, user_id, decision, comment, "
        "\"values\", \"group\", at, channel, chat_identity, signature_meaning, "
        "signature_method, signer_name, signature_digest, evidence_digest) "
        "VALUES (%s, %s, %s, 'approve', 'me too', '{}', 'qa', %s, 'web', '', '', '', '', "
        "'', '')", [row["step_id"], row["attempt"], people["carol"].pk, row["at"]])
    found = verify().problems
    assert [(run_id, seq) for run_id, seq, _ in found] == [(decided.pk, 0)]
    assert "no checkpoint records" in found[0][2]


def test_a_deleted_checkpoint_is_named(decided):
    raw("DELETE FROM workflows_checkpoint WHERE run_id = %s AND seq = 3", [decided.pk])
    assert "seq 3 is missing" in named(decided, 3)


def test_the_last_checkpoint_deleted_is_named(decided):
    last = decided.checkpoints.count()
    raw("DELETE FROM workflows_checkpoint WHERE run_id = %s AND seq = %s", [decided.pk, last])
    assert "last hash" in named(decided, last)


def test_two_checkpoints_swapped_are_named(decided):
    for old, new in ((2, 1000), (3, 2), (1000, 3)):
        raw("UPDATE workflows_checkpoint SET seq = %s WHERE run_id = %s AND seq = %s",
            [new, decided.pk, old])
    assert "does not follow" in named(decided, 2)


def test_other_runs_still_verify_beside_a_tampered_one(decided, release_spec):
    other = engine.open_run(release_spec).run
    raw("UPDATE workflows_checkpoint SET summary = 'x' WHERE run_id = %s AND seq = 1",
        [decided.pk])
    assert verify([other.pk]).ok and not verify([decided.pk]).ok


def rewrite_from(run, seq: int, summary: str) -> None:
    """What a database user who knows the chain does: change a checkpoint, then recompute
    every hash from it on, and the run's last hash."""
    from workflows.audit import chain

    raw("UPDATE workflows_checkpoint SET summary = %s WHERE run_id = %s AND seq = %s",
        [summary, run.pk, seq])
    prev = ""
    for row in Checkpoint.objects.filter(run=run).order_by("seq").values(*chain.FIELDS):
        hash_ = chain.link(prev, row)
        raw("UPDATE workflows_checkpoint SET prev_hash = %s, hash = %s "
            "WHERE run_id = %s AND seq = %s", [prev, hash_, run.pk, row["seq"]])
        prev = hash_
    raw("UPDATE workflows_run SET chain_head = %s WHERE id = %s", [prev, run.pk])


def test_a_chain_rewritten_whole_is_found_by_its_seal(decided):
    assert seals.seal() == 1
    rewrite_from(decided, 2, "nothing to see")
    found = verify().problems
    sealed = AuditSeal.objects.get()
    assert [(run_id, seq) for run_id, seq, _ in found] == [(decided.pk, sealed.seq)]
    assert "the chain was rewritten" in found[0][2]


def test_without_a_seal_a_whole_rewrite_goes_unseen(decided):
    """The limit the README states: what happened after the last seal has only the chain."""
    rewrite_from(decided, 2, "nothing to see")
    assert verify().ok


def test_seals_follow_runs_as_they_move_and_cannot_be_edited_or_dropped(decided, people,
                                                                       release_spec):
    assert seals.seal() == 1 and seals.seal() == 0  # nothing moved since
    other = engine.open_run(release_spec).run
    assert seals.seal() == 1  # the new run only
    assert verify().ok and verify().seals == 2
    first = AuditSeal.objects.order_by("pk").first()
    raw("UPDATE workflows_auditseal SET seq = 1 WHERE id = %s", [first.pk])
    assert "not what was signed" in verify().problems[0][2]
    raw("UPDATE workflows_auditseal SET seq = %s WHERE id = %s", [first.seq, first.pk])
    raw("DELETE FROM workflows_auditseal WHERE id = %s", [first.pk])
    assert [what for _, _, what in verify().problems] == [
        f"seal {first.pk + 1}: a seal before it is missing"]
    assert other.pk != decided.pk


def test_a_pruned_run_is_signed_as_pruned_and_one_deleted_by_hand_is_not(
        decided, release_spec, settings, tmp_path):
    from datetime import timedelta

    from workflows.ops.retention import prune_runs
    from workflows.timing import clock

    gone = engine.open_run(release_spec).run
    engine.cancel_run(gone, reason="not needed")
    engine.cancel_run(decided, reason="not needed")
    seals.seal()
    with open(tmp_path / "pruned.jsonl", "w") as out:
        assert prune_runs(0, out, now=clock.now() + timedelta(days=1)) == 2
    assert verify().ok
    kept = engine.open_run(release_spec).run
    seals.seal()
    for sql in ("DELETE FROM workflows_checkpoint WHERE run_id = %s",
                "DELETE FROM workflows_step WHERE run_id = %s",
                "DELETE FROM workflows_run WHERE id = %s"):
        raw(sql, [kept.pk])
    assert [(run_id, what) for run_id, _, what in verify().problems] == [
        (kept.pk, "the run is gone, and retention did not prune it")]


def test_the_public_key_is_published(client, decided, settings, tmp_path):
    settings.TOLLGATE_AUDIT_KEY_FILE = str(tmp_path / "key.pem")
    seals._private_key.cache_clear()
    assert client.get("/audit/key").status_code == 404  # nothing sealed: no key made here
    assert not (tmp_path / "key.pem").exists()
    seals.seal()
    answer = client.get("/audit/key")
    assert answer.status_code == 200 and b"BEGIN PUBLIC KEY" in answer.content


def test_an_export_verifies_offline_and_an_edited_one_does_not(decided, people, tmp_path,
                                                              client):
    seals.seal()
    token = ApiToken.objects.issue(people["alice"])[1]
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/runs/{decided.pk}/audit")
    assert answer.status_code == 200
    export = answer.json()
    assert len(export["seals"]) == 1
    key = tmp_path / "key.pem"
    key.write_bytes(client.get("/audit/key").content)
    good, bad, forged = (tmp_path / name for name in ("good.json", "bad.json", "forged.json"))
    good.write_text(json.dumps(export))
    edited = json.loads(json.dumps(export))
    edited["timeline"][1]["summary"] = "edited in the file"
    bad.write_text(json.dumps(edited))
    # Edited, every hash recomputed: the seal no longer matches.
    from workflows.audit import chain

    prev = ""
    for row in edited["timeline"]:
        row["prev_hash"] = prev
        row["hash"] = prev = chain.link(prev, {**row, "run_id": export["run"],
                                               "actor_name": row["actor"]})
    edited["chain_head"] = prev
    forged.write_text(json.dumps(edited))

    def check(path):
        # Django cannot be imported: the script needs only the standard library and
        # cryptography.
        script = ROOT / "scripts" / "verify-audit-export"
        wrapper = ("import sys; sys.modules['django'] = None; "
                   f"sys.argv = {[str(script), '--key', str(key), str(path)]!r}; "
                   f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'), "
                   f"{{'__file__': {str(script)!r}, '__name__': '__main__'}})")
        return subprocess.run([sys.executable, "-I", "-c", wrapper], capture_output=True,
                              text=True, timeout=60)

    ok = check(good)
    assert ok.returncode == 0 and "1 seal(s) verify" in ok.stdout, ok.stdout + ok.stderr
    changed = check(bad)
    assert changed.returncode == 1 and "seq 2" in changed.stdout, changed.stdout
    rewritten = check(forged)
    assert rewritten.returncode == 1 and "the chain was rewritten" in rewritten.stdout, (
        rewritten.stdout + rewritten.stderr)
    # The same rewrite with its seals taken out: with the key in hand, refused.
    forged.write_text(json.dumps({**edited, "seals": []}))
    unsealed = check(forged)
    assert unsealed.returncode == 1 and "carries no seal" in unsealed.stdout, unsealed.stdout
    # What sits beside the chain in the file and the chain vouches for.
    for name, edit, said in [
            ("decision", lambda e: e["decisions"][0].update(comment="ship v2"), "other words"),
            ("decision-record", lambda e: e["decisions"][0]["record"].update(comment="v2"),
             "not the one any checkpoint records"),
            ("decision-gone", lambda e: e.update(decisions=[]), "is not in the export"),
            ("state", lambda e: e["timeline"][-1]["state"].update(artifact="evil"),
             "the state shown after it"),
            ("title", lambda e: e.update(title="Another release"), "was opened as")]:
        changed = json.loads(json.dumps(export))
        edit(changed)
        (tmp_path / f"{name}.json").write_text(json.dumps(changed))
        found = check(tmp_path / f"{name}.json")
        assert found.returncode == 1 and said in found.stdout, (name, found.stdout)
    assert "not covered: step keys and titles" in ok.stdout


def test_chains_are_sealed_once_a_period(settings):
    from datetime import UTC, datetime, timedelta

    from workflows.tasks import every_seal

    settings.TOLLGATE_AUDIT_SEAL_SECONDS, settings.TOLLGATE_SWEEP_SECONDS = 600, 10
    start = datetime(2026, 12, 6, tzinfo=UTC)
    ticks = [start + timedelta(seconds=10 * i) for i in range(360)]  # an hour of ticks
    assert sum(every_seal(tick) for tick in ticks) == 6


def test_the_workers_page_and_the_metrics_say_what_the_last_check_found(decided, settings):
    from workflows.models import PeriodicRun
    from workflows.ops.metrics import scrape

    settings.TOLLGATE_METRICS_TOKEN = ""
    call_command("verify_audit")
    assert PeriodicRun.objects.get(name="verify_audit").last_error == ""
    raw("UPDATE workflows_checkpoint SET summary = 'x' WHERE run_id = %s AND seq = 1",
        [decided.pk])
    with pytest.raises(CommandError):
        call_command("verify_audit")
    assert f"run {decided.pk} seq 1" in PeriodicRun.objects.get(name="verify_audit").last_error
    assert b'tollgate_periodic_failed{task="verify_audit"} 1.0' in scrape()


@pytest.fixture
def authority(settings, tmp_path):
    """A local RFC 3161 authority (openssl ts), the seal task pointed at it."""
    from ..support.tsa import LocalAuthority

    local = LocalAuthority(tmp_path)
    settings.TOLLGATE_AUDIT_TSA_URL = local.url
    settings.TOLLGATE_AUDIT_TSA_CA_FILE = local.ca_file
    yield local
    local.stop()


def test_the_newest_seal_is_timestamped_by_the_authority(decided, authority, tmp_path):
    """The token is the authority's own answer: openssl verifies it without Tollgate."""
    import hashlib

    from workflows.audit import timestamps
    from workflows.models import AuditTimestamp

    seals.seal()
    stamped = timestamps.stamp()
    newest = AuditSeal.objects.get()
    assert (stamped.seal_digest, stamped.seal_id) == (newest.digest, newest.pk)
    assert timestamps.stamp() is None and authority.requests == 1  # stamped already
    verdict = verify()
    assert verdict.ok and verdict.timestamps == 1
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("UPDATE workflows_audittimestamp SET authority = 'elsewhere'")
    token = tmp_path / "token.tsr"
    token.write_bytes(bytes(AuditTimestamp.objects.get().token))
    checked = subprocess.run(
        ["openssl", "ts", "-verify", "-digest",
         hashlib.sha256(newest.digest.encode()).hexdigest(), "-sha256", "-in", str(token),
         "-CAfile", authority.ca_file], capture_output=True, text=True)
    assert checked.returncode == 0 and "Verification: OK" in checked.stdout


def test_a_key_holder_who_rewrites_and_seals_again_is_found_by_the_timestamp(decided,
                                                                              authority):
    """Someone with the signing key rewrites a chain, deletes the seals and signs new ones:
    the seals all verify, and the authority's timestamp names a seal no longer there."""
    from workflows.audit import timestamps

    seals.seal()
    timestamps.stamp()
    rewrite_from(decided, 2, "nothing to see")
    raw("DELETE FROM workflows_auditseal")
    assert seals.seal() == 1
    found = verify().problems
    assert len(found) == 1 and "no longer in the chain (the seals were rewritten)" in found[0][2]


def test_an_answer_for_something_else_or_a_forged_token_does_not_hold(decided, authority):
    from workflows.audit import timestamps
    from workflows.models import AuditTimestamp

    seals.seal()
    authority.tampered = True
    with pytest.raises(timestamps.NotStamped, match="timestamps something other"):
        timestamps.stamp()
    assert not AuditTimestamp.objects.exists()
    authority.tampered = False
    timestamps.stamp()
    raw("UPDATE workflows_audittimestamp SET token = %s", [b"\x30\x03\x02\x01\x00"])
    assert "not a timestamp authority's answer" in verify().problems[0][2]


def test_an_authority_away_keeps_nothing_and_says_so(decided, settings):
    from workflows.audit import timestamps
    from workflows.models import AuditTimestamp

    from ..support.processes import free_port

    settings.TOLLGATE_AUDIT_TSA_URL = f"http://127.0.0.1:{free_port()}/tsr"
    seals.seal()
    with pytest.raises(timestamps.NotStamped, match="did not answer"):
        timestamps.stamp()
    assert not AuditTimestamp.objects.exists()


def test_an_authority_without_roots_to_check_it_is_a_configuration_error(settings):
    from workflows.ops.checks import audit_timestamps

    settings.TOLLGATE_AUDIT_TSA_URL = "https://tsa.example/tsr"
    settings.TOLLGATE_AUDIT_TSA_CA_FILE = ""
    assert [e.id for e in audit_timestamps(None)] == ["tollgate.E005"]


def test_verifying_needs_only_the_public_key_and_makes_none(decided, settings, tmp_path):
    """The sealer writes the public half beside its key; the verifier and the web server
    read only that, and a verifier with no key at all creates none (it would "verify" with
    a key of its own making)."""
    seals.seal()
    public = seals.public_path()
    assert public.exists() and b"PUBLIC KEY" in public.read_bytes()
    settings.TOLLGATE_AUDIT_PUBLIC_KEY_FILE = str(public)
    settings.TOLLGATE_AUDIT_KEY_FILE = str(tmp_path / "not-here.pem")  # out of reach
    seals._private_key.cache_clear()
    assert verify().ok
    settings.TOLLGATE_AUDIT_PUBLIC_KEY_FILE = str(tmp_path / "nor-here.pem")
    found = verify().problems
    assert found and "cannot be checked" in found[0][2]
    assert not (tmp_path / "not-here.pem").exists() and not (tmp_path / "nor-here.pem").exists()


def test_every_seal_deleted_and_a_run_rewritten_is_found(decided, settings, tmp_path):
    """TRUNCATE fires no row trigger, and without an authority nothing in the database
    vouches for the seals: the head verify_audit kept outside the database does, and a run
    whose chain stands unsealed past two periods is named."""
    from datetime import timedelta

    from workflows.models import Run
    from workflows.timing import clock

    settings.TOLLGATE_AUDIT_HEAD_FILE = str(tmp_path / "head.json")
    seals.seal()
    call_command("verify_audit", stdout=io.StringIO())  # holds: the head is kept
    assert json.loads((tmp_path / "head.json").read_text())["seals"] == 1
    raw("DELETE FROM workflows_auditseal")
    with pytest.raises(CommandError, match="shorter than when it was last verified"):
        call_command("verify_audit", stdout=io.StringIO())
    Run.objects.filter(pk=decided.pk).update(updated_at=clock.now() - timedelta(
        seconds=2 * settings.TOLLGATE_AUDIT_SEAL_SECONDS + 600))
    found = verify().problems
    assert [(run_id, "unsealed" in what) for run_id, _, what in found] == [(decided.pk, True)]


def test_a_trigger_dropped_is_said(decided):
    from importlib import import_module

    from django.db import connection

    migration = import_module("workflows.migrations.0058_decisions_append_only")
    with connection.cursor() as cursor:
        for statement in (migration.POSTGRESQL_DROP if connection.vendor == "postgresql"
                          else migration.SQLITE_DROP):
            cursor.execute(statement)
    found = verify().problems
    assert found and all("workflows_approval" in what and "missing or disabled" in what
                         for _, _, what in found)


def test_a_tampered_run_warns_on_its_page_and_in_the_api(decided, people):
    from tests.api.conftest import Api

    bob = Client()
    bob.force_login(people["bob"])
    assert 'id="record-warning"' not in bob.get(f"/runs/{decided.pk}/").content.decode()
    assert Api(people["bob"]).get(f"/api/runs/{decided.pk}").json()["record_warning"] == ""
    raw("UPDATE workflows_approval SET comment = 'ship v2 instead'")
    page = bob.get(f"/runs/{decided.pk}/").content.decode()
    assert 'id="record-warning"' in page and "differs from what its checkpoint" in page
    assert "does not verify" in Api(people["bob"]).get(
        f"/api/runs/{decided.pk}").json()["record_warning"]
    raw("UPDATE workflows_checkpoint SET summary = 'nothing to see' WHERE run_id = %s "
        "AND seq = 2", [decided.pk])
    assert "checkpoint 2 does not match its hash" in bob.get(
        f"/runs/{decided.pk}/").content.decode()

"""The audit chain: what a database user changes behind the application's back is named by
`manage.py verify_audit` (run and seq), and an exported timeline verifies offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from workflows import engine
from workflows.audit.verify import verify
from workflows.models import ApiToken, Checkpoint

from ..support.processes import ROOT

pytestmark = pytest.mark.django_db


@pytest.fixture
def decided(waiting, people):
    """A run whose build ran and whose QA gate bob approved: six checkpoints or so."""
    engine.approve(waiting, "qa", user=people["bob"], comment="looks good")
    return waiting


def raw(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def named(run, seq: int) -> str:
    with pytest.raises(CommandError) as failed:
        call_command("verify_audit")
    assert "do not verify" in str(failed.value)
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
    assert "every chain holds" in capsys.readouterr().out


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


def test_an_export_verifies_offline_and_an_edited_one_does_not(decided, people, tmp_path):
    token = ApiToken.objects.issue(people["alice"])[1]
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/runs/{decided.pk}/audit")
    assert answer.status_code == 200
    export = answer.json()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(export))
    export["timeline"][1]["summary"] = "edited in the file"
    bad.write_text(json.dumps(export))
    script = ROOT / "scripts" / "verify-audit-export"
    # -I: no site-packages, no environment: the script needs no Django and no Tollgate.
    ok = subprocess.run([sys.executable, "-I", str(script), str(good)], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "verify" in ok.stdout, ok.stdout + ok.stderr
    edited = subprocess.run([sys.executable, "-I", str(script), str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert edited.returncode == 1 and "seq 2" in edited.stdout, edited.stdout + edited.stderr

"""Keeping the database in bounds: old records pruned by their settings; finished runs
exported (what is exported is what is deleted) and only then deleted; open runs untouched."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.workflows.helpers import work
from workflows import engine
from workflows.models import (
    Approval,
    ChatInteraction,
    Checkpoint,
    Notification,
    OutboxMessage,
    Run,
    Step,
    WebhookDelivery,
)
from workflows.ops import retention

pytestmark = pytest.mark.django_db


def age(run: Run, days: float) -> None:
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=days))


@pytest.fixture
def history(release_spec, people):
    """Two old finished runs (one with a decision), one recent, one old but open."""
    old_done = engine.open_run(release_spec, actor=people["alice"]).run
    work(old_done, "build")
    engine.approve(old_done, "qa", user=people["bob"], comment="fine")
    engine.cancel_run(old_done, actor=people["alice"])
    old_cancelled = engine.open_run(release_spec, actor=people["alice"]).run
    engine.cancel_run(old_cancelled, actor=people["alice"])
    recent = engine.open_run(release_spec, actor=people["alice"]).run
    engine.cancel_run(recent, actor=people["alice"])
    still_open = engine.open_run(release_spec, actor=people["alice"]).run
    Run.objects.filter(pk=still_open.pk).update(created_at=timezone.now() - timedelta(days=400))
    for run in (old_done, old_cancelled):
        age(run, 200)
    return {"old": [old_done, old_cancelled], "recent": recent, "open": still_open}


def test_prune_runs_exports_exactly_what_it_deletes(history, tmp_path):
    out = tmp_path / "pruned.jsonl"
    counted = io.StringIO()
    call_command("prune_runs", "--older-than", "90", "--dry-run", stdout=counted)
    assert counted.getvalue().startswith("2 finished run(s)")
    checkpoints = {run.pk: Checkpoint.objects.filter(run=run).count() for run in history["old"]}
    call_command("prune_runs", "--older-than", "90", "--out", str(out), "--batch", "1",
                 stdout=io.StringIO())
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(e["run"] for e in exported) == sorted(r.pk for r in history["old"])
    for entry in exported:
        assert len(entry["timeline"]) == checkpoints[entry["run"]]
    assert [d["comment"] for e in exported for d in e["decisions"]] == ["fine"]
    assert not Run.objects.filter(pk__in=[r.pk for r in history["old"]]).exists()
    assert not Step.objects.filter(run_id__in=[r.pk for r in history["old"]]).exists()
    assert not Approval.objects.exists()
    assert Run.objects.filter(pk__in=[history["recent"].pk, history["open"].pk]).count() == 2
    assert Checkpoint.objects.filter(run=history["open"]).exists()


def test_the_prune_export_is_its_owners_alone(history, tmp_path):
    import stat

    out = tmp_path / "pruned.jsonl"
    call_command("prune_runs", "--older-than", "90", "--out", str(out), stdout=io.StringIO())
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_prune_refuses_a_bad_age(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--older-than"):
        call_command("prune_runs", "--older-than", "-1")


def test_old_records_are_pruned_by_their_settings(history, settings, people):
    settings.TOLLGATE_KEEP_NOTIFICATIONS_DAYS = 30
    old = timezone.now() - timedelta(days=45)
    kept = Notification.objects.create(user=people["bob"], key="new", event="e", subject="s",
                                       body="b")
    gone = Notification.objects.create(user=people["bob"], key="old", event="e", subject="s",
                                       body="b", created_at=old)
    run = history["recent"]
    delivered = WebhookDelivery.objects.create(
        webhook=_webhook(), key="k1", event="gate_waiting", payload={}, status="delivered",
        created_at=timezone.now() - timedelta(days=60))
    pending = WebhookDelivery.objects.create(
        webhook=_webhook(), key="k2", event="gate_waiting", payload={}, status="pending",
        created_at=timezone.now() - timedelta(days=60))
    done = OutboxMessage.objects.create(run=run, seq=1, job="notify", events=[],
                                        done_at=timezone.now() - timedelta(days=10))
    pruned = retention.prune_records()
    assert pruned["notifications"] == 1 and pruned["webhook_deliveries"] == 1
    assert pruned["outbox_messages"] == 1
    assert list(Notification.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not WebhookDelivery.objects.filter(pk=delivered.pk).exists()
    assert WebhookDelivery.objects.filter(pk=pending.pk).exists()  # still owed
    assert not OutboxMessage.objects.filter(pk=done.pk).exists() and gone.pk


def test_handled_chat_presses_are_pruned_but_unhandled_ones_kept(db, settings):
    settings.TOLLGATE_KEEP_OUTBOX_DAYS = 7
    long_ago = timezone.now() - timedelta(days=10)
    handled = ChatInteraction.objects.create(provider="slack", digest="a", payload={},
                                             received_at=long_ago, done_at=long_ago)
    recent = ChatInteraction.objects.create(provider="slack", digest="b", payload={},
                                            done_at=timezone.now())
    owed = ChatInteraction.objects.create(provider="slack", digest="c", payload={},
                                          received_at=long_ago)
    assert retention.prune_records()["chat_interactions"] == 1
    assert set(ChatInteraction.objects.values_list("pk", flat=True)) == {recent.pk, owed.pk}
    assert not ChatInteraction.objects.filter(pk=handled.pk).exists()


def _webhook():
    from workflows.models import Webhook

    return Webhook.objects.get_or_create(group="qa", url="https://hooks.example/t",
                                         defaults={"secret": "s"})[0]


def test_goal_rollups_stay_true_after_pruning(release_spec, people, tmp_path):
    from goals.models import Goal
    from goals.rollup import rollups

    parent = Goal.objects.create(title="Releases")
    goal = Goal.objects.create(title="Release 3", parent=parent)
    done = engine.open_run(release_spec, actor=people["alice"], goal=goal).run
    work(done, "build")
    engine.approve(done, "qa", user=people["bob"])
    engine.approve(done, "qa", user=people["carol"])
    work(done, "deploy")
    work(done, "notify")
    failed = engine.open_run(release_spec, actor=people["alice"], goal=goal).run
    work(failed, "build", "failed")
    engine.open_run(release_spec, actor=people["alice"], goal=goal)  # open: stays
    assert Run.objects.get(pk=done.pk).status == "completed"
    before = rollups([parent.pk, goal.pk])
    for run in (done, failed):
        age(run, 100)
    with open(tmp_path / "out.jsonl", "w") as out:
        assert retention.prune_runs(90, out) == 2
    assert rollups([parent.pk, goal.pk]) == before

"""The rules behind one live attempt and nothing lost, in-process: the sweeper's liveness
check and isolation, bounded specs, idempotency keys that mean one request, protected
checkpoints, reports retried across a database blink."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.db.models import ProtectedError
from django.test import Client
from django.utils import timezone

from workflows import engine
from workflows.engine import processes
from workflows.models import ApiToken, Checkpoint, Run, Step
from workflows.recovery import sweeper
from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, validate_spec
from workflows.workers import worker

pytestmark = pytest.mark.django_db


def work_spec(name="w", **step):
    return store_spec({"name": name, "steps": [
        {"key": "a", "max_retries": 1, "run": {"command": ["true"]}, **step}]})[0]


def claimed(run, holder):
    """The step claimed by `holder` and begun (a lone claim begins at once), its lease run
    out."""
    step = Step.objects.get(run=run, key="a")
    engine.claim_step(step.pk, owner="w1", lease_seconds=30, holder=holder)
    step.refresh_from_db()
    assert step.began_at is not None
    Step.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return step


class TestSweeperChecksTheHolder:
    def test_a_live_holder_keeps_its_step_and_is_noted_once(self):
        run = engine.open_run(work_spec()).run
        step = claimed(run, processes.this_process())  # this test process: alive
        for _ in range(3):
            report = sweeper.sweep()
        assert report.expired == 0
        assert Step.objects.get(pk=step.pk).status == "running"
        assert Checkpoint.objects.filter(run=run, kind="lease_overdue").count() == 1

    def test_a_live_holder_that_let_go_of_the_lease_loses_it(self):
        """Its database was away past the lease: the holder let go of it, and its next
        presence report no longer lists it, so the sweeper takes it back (the step is not
        stuck behind a holder that will never record it)."""
        from workflows.recovery import presence

        run = engine.open_run(work_spec()).run
        step = claimed(run, processes.this_process())
        presence.report([f"step:{step.pk}"])  # still holding it, as far as it knows
        assert sweeper.sweep().expired == 0
        presence.report([])  # reported after the lease ran out, without it
        assert sweeper.sweep().expired == 1
        assert Step.objects.get(pk=step.pk).status == "retrying"

    @pytest.mark.parametrize("where", ["this machine", "another machine", "another pid namespace"])
    def test_a_lost_holders_unstarted_steps_are_given_back_unspent_wherever_it_ran(
            self, settings, where):
        """A consumer claimed a batch of three and was lost while the first ran: the first
        is charged its attempt (it began), the other two, which the database knows never
        began, are given back with none spent (so with no retries left they still run),
        at once, wherever the holder ran: nothing of them could be running anywhere."""
        from workflows.engine import batches

        settings.TOLLGATE_KILL_GRACE_SECONDS = 3600  # a holder elsewhere is waited for long
        spec = work_spec("batch", max_retries=0)
        for _ in range(3):
            engine.open_run(spec)
        me = processes.this_process()
        ghost = {"this machine": processes.Holder(me.host, me.boot_id, me.pid,
                                                  (me.started or 0) + 1, me.pidns),
                 "another machine": processes.Holder("elsewhere", "another-boot", 4242, 99),
                 "another pid namespace": processes.Holder(me.host, me.boot_id, 1, 5,
                                                           "pid:[4026999999]")}[where]
        batch = batches.claim_many(engine.Chain("w1", 30, ghost), 3)
        assert len(batch) == 3
        first, rest = batch[0], batch[1:]
        assert Step.objects.get(pk=first.pk).began_at is not None
        assert not Step.objects.filter(pk__in=[s.pk for s in rest], began_at__isnull=False)
        Step.objects.filter(pk__in=[s.pk for s in batch]).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        report = sweeper.sweep()
        assert report.released == 2
        assert report.expired == (1 if where == "this machine" else 0)  # the grace, elsewhere
        for step in rest:
            row = Step.objects.get(pk=step.pk)
            assert (row.status, row.lease_token, row.attempt_base) == ("retrying", "", 1)
            note = Checkpoint.objects.get(step=row, kind="step_released")
            assert "lease ran out before its turn came" in note.summary
            assert "no attempt spent" in note.summary
        assert not Checkpoint.objects.filter(step__in=[s.pk for s in rest],
                                             kind="step_failed").exists()

    def test_a_claim_by_a_release_from_before_began_at_counts_as_begun(self, settings):
        """During an upgrade an older consumer claims as it always did, leaving began_at as
        the row has it: never null (a new row takes its creation time), so its lease is
        judged as before (waiting out the kill grace for a holder elsewhere), never given
        back as unbegun while its command may run."""
        settings.TOLLGATE_KILL_GRACE_SECONDS = 3600
        run = engine.open_run(work_spec("older")).run
        step = Step.objects.get(run=run)
        assert step.began_at is not None
        Step.objects.filter(pk=step.pk).update(  # the older release's claim: no began_at
            status="running", attempt=1, lease_owner="worker old", lease_token="0" * 32,
            lease_expires_at=timezone.now() - timedelta(seconds=1), holder_host="elsewhere",
            holder_boot_id="another-boot", holder_pid=4242, holder_started=99)
        report = sweeper.sweep()
        assert (report.released, report.expired) == (0, 0)
        assert Step.objects.get(pk=step.pk).status == "running"

    def test_a_step_whose_turn_came_is_begun_and_no_longer_given_back(self):
        from workflows.engine import batches

        runs = [engine.open_run(work_spec("turns")).run for _ in range(2)]
        ghost = processes.Holder("elsewhere", "another-boot", 4242, 99)
        first, second = batches.claim_many(engine.Chain("w1", 30, ghost), 2)
        assert engine.mark_began(second.pk, second.lease_token)
        assert not engine.mark_began(second.pk, "another attempt's token")
        Step.objects.filter(pk__in=[first.pk, second.pk]).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert sweeper.sweep().released == 0
        assert {Step.objects.get(pk=s.pk).status for s in (first, second)} == {"running"}
        assert len(runs) == 2

    def test_a_live_holder_that_let_go_gives_back_what_it_had_not_begun(self):
        """Its database was away past the lease, so it let go of its claims: the one it had
        begun is reclaimed saying the worker let go (and stopped it), not that it is gone;
        the ones it had not begun go back unspent."""
        from workflows.engine import batches
        from workflows.recovery import presence

        spec = work_spec("letgo", max_retries=1)
        for _ in range(3):
            engine.open_run(spec)
        batch = batches.claim_many(engine.Chain("w1", 30, processes.this_process()), 3)
        presence.report([f"step:{s.pk}" for s in batch])
        Step.objects.filter(pk__in=[s.pk for s in batch]).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        presence.report([])  # after the lease ran out, holding none of them
        report = sweeper.sweep()
        assert (report.expired, report.released) == (1, 2)
        failed = Checkpoint.objects.get(step=batch[0].pk, kind="step_retrying")
        assert "let go by its worker, which lives" in failed.summary
        assert "gone" not in failed.summary

    def test_a_gone_holder_is_reclaimed(self):
        run = engine.open_run(work_spec()).run
        me = processes.this_process()
        ghost = processes.Holder(me.host, me.boot_id, me.pid, (me.started or 0) + 1)
        step = claimed(run, ghost)  # same pid, other start time: a reused pid, not us
        assert sweeper.sweep().expired == 1
        assert Step.objects.get(pk=step.pk).status == "retrying"

    def test_a_holder_on_another_machine_waits_for_the_kill_grace(self, settings):
        settings.TOLLGATE_KILL_GRACE_SECONDS = 60
        run = engine.open_run(work_spec()).run
        step = claimed(run, processes.Holder("elsewhere", "another-boot", 4242, 99))
        assert sweeper.sweep().expired == 0
        Step.objects.filter(pk=step.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=61))
        assert sweeper.sweep().expired == 1

    def test_a_rebooted_host_has_no_live_holder(self):
        run = engine.open_run(work_spec()).run
        me = processes.this_process()
        claimed(run, processes.Holder(me.host, "an-earlier-boot", me.pid, me.started))
        assert sweeper.sweep().expired == 1

    def test_one_bad_row_does_not_stop_the_sweep(self, monkeypatch):
        runs = [engine.open_run(work_spec(f"w{i}")).run for i in range(2)]
        ghost = processes.Holder(processes.this_process().host, "gone-boot", 1, 1)
        bad, good = (claimed(run, ghost) for run in runs)
        real, real_run = engine.expire_lease, engine.expire_leases

        def expire(step_id, **kwargs):
            if step_id == bad.pk:
                raise OverflowError("date value out of range")
            return real(step_id, **kwargs)

        def expire_run(leases, **kwargs):
            if any(bad.pk in step_ids for step_ids in leases.values()):
                raise OverflowError("date value out of range")
            return real_run(leases, **kwargs)

        monkeypatch.setattr(engine, "expire_lease", expire)
        monkeypatch.setattr(engine, "expire_leases", expire_run)
        for _ in range(3):
            report = sweeper.sweep()
        assert Step.objects.get(pk=good.pk).status == "retrying"
        assert report.failed == 1
        notes = Checkpoint.objects.filter(run=runs[0], kind="sweep_failed")
        assert notes.count() == 1 and "OverflowError" in notes.get().summary


class TestBoundedSpecs:
    @pytest.mark.parametrize("field, value, message", [
        ("retry_backoff_seconds", 1e300, "at most 86400"),
        ("max_retries", 10**9, "at most 100"),
        ("retry_backoff_seconds", float("inf"), "finite"),
    ])
    def test_step_numbers_are_bounded(self, field, value, message):
        with pytest.raises(SpecError, match=message):
            validate_spec({"name": "x", "steps": [
                {"key": "a", field: value, "run": {"command": ["true"]}}]})

    def test_gate_timeouts_and_quorums_are_bounded(self):
        with pytest.raises(SpecError, match="timeout_seconds must be at most"):
            validate_spec({"name": "x", "steps": [
                {"key": "g", "approval": {"group": "qa", "timeout_seconds": 1e300}}]})
        with pytest.raises(SpecError, match="required must be at most 100"):
            validate_spec({"name": "x", "steps": [
                {"key": "g", "approval": {"group": "qa", "required": 1000}}]})

    @pytest.mark.parametrize("key", ["a/b", "a b", "x" * 101, "é"])
    def test_step_keys_are_plain(self, key):
        with pytest.raises(SpecError, match="letters, digits"):
            validate_spec({"name": "x", "steps": [{"key": key, "run": {"command": ["true"]}}]})

    def test_a_stored_extreme_backoff_cannot_break_a_failure(self):
        run = engine.open_run(work_spec()).run
        Step.objects.filter(run=run).update(retry_backoff_seconds=1e300)
        engine.start_step(run, "a")
        engine.fail_step(run, "a", summary="boom")
        assert Step.objects.get(run=run).status == "retrying"


class TestIdempotencyKeys:
    def test_same_request_reuses_the_run(self, release_spec, people):
        first = engine.open_run(release_spec, idempotency_key="k", shared_state={"a": 1})
        again = engine.open_run(release_spec, idempotency_key="k", shared_state={"a": 1})
        assert again.reused and again.run.pk == first.run.pk

    def test_a_different_request_is_409_naming_what_differs(self, release_spec, people):
        engine.open_run(release_spec, idempotency_key="k", shared_state={"a": 1}, title="One")
        for change, named in [({"shared_state": {"a": 2}}, "shared_state"),
                              ({"title": "Two"}, "title")]:
            request = {"shared_state": {"a": 1}, "title": "One", **change}
            with pytest.raises(engine.IllegalTransition, match=named):
                engine.open_run(release_spec, idempotency_key="k", **request)
        assert Run.objects.count() == 1

    def test_a_key_is_scoped_to_its_spec_and_goal(self, release_spec, people):
        """The seeds' scope: the same words under another spec, or another goal, name
        another request; under the same spec and goal, the same one."""
        from goals.models import Goal

        first = engine.open_run(release_spec, idempotency_key="k").run
        other = store_spec({"name": "other", "steps": [{"key": "a", "run": {
            "command": ["true"]}}]})[0]
        elsewhere = engine.open_run(other, idempotency_key="k")
        assert not elsewhere.reused and elsewhere.run.pk != first.pk
        goal = Goal.objects.create(title="G")
        under_goal = engine.open_run(release_spec, idempotency_key="k", goal=goal)
        assert not under_goal.reused and under_goal.run.goal == goal
        again = engine.open_run(release_spec, idempotency_key="k", goal=goal)
        assert again.reused and again.run.pk == under_goal.run.pk
        assert engine.open_run(release_spec, idempotency_key="k").run.pk == first.pk
        assert Run.objects.count() == 3

    def test_another_callers_key_is_free_to_them_and_tells_nothing(self, release_spec,
                                                                    people, settings):
        """A key is one caller's: someone else using the same words opens their own run.
        They learn nothing of the other run (not even that it exists) and cannot take it."""
        from tests.conftest import make_user

        settings.TOLLGATE_RUN_VISIBILITY = "involved"
        theirs = engine.open_run(release_spec, actor=people["bob"], idempotency_key="k1").run
        outsider = make_user("ola", perms=("add_run",))
        token = ApiToken.objects.issue(outsider)[1]
        api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        for _ in range(2):  # and a retry of theirs finds their own
            response = api.post("/api/runs", {"spec": "release", "idempotency_key": "k1"},
                                content_type="application/json")
            assert response.status_code in (200, 201)
            assert response.json()["id"] != theirs.pk
        assert response.status_code == 200  # reused
        assert Run.objects.filter(idempotency_key="k1").count() == 2
        assert engine.open_run(release_spec, actor=people["bob"],
                               idempotency_key="k1").run.pk == theirs.pk

    def test_api_and_command_answer_409(self, release_spec, people):
        engine.open_run(release_spec, actor=people["alice"], idempotency_key="k",
                        shared_state={"a": 1})
        engine.open_run(release_spec, idempotency_key="k", shared_state={"a": 1})
        token = ApiToken.objects.issue(people["alice"])[1]
        response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
            "/api/runs", {"spec": "release", "idempotency_key": "k", "shared_state": {"a": 2}},
            content_type="application/json")
        assert response.status_code == 409 and "shared_state" in response.json()["error"]
        with pytest.raises(CommandError, match="shared_state"):
            call_command("start_run", "release", "--idempotency-key", "k", "--state",
                         json.dumps({"a": 3}), stdout=io.StringIO())


def test_checkpoints_survive_their_run(release_spec, admin_client):
    run = engine.open_run(release_spec).run
    with pytest.raises(ProtectedError):
        run.delete()
    response = admin_client.get(f"/admin/workflows/run/{run.pk}/delete/", follow=True)
    assert "never deleted" in response.content.decode()
    assert Run.objects.filter(pk=run.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_result_is_reported_across_a_database_blink(monkeypatch, settings):
    """The completion's first two tries meet a dropped connection; the third records it."""
    settings.TOLLGATE_REPORT_RETRY_SECONDS = 10
    run = engine.open_run(work_spec()).run
    failures = {"left": 2}

    def blink(execute, sql, params, many, context):
        if (failures["left"] and "workflows_checkpoint" in sql and "INSERT" in sql
                and "step_completed" in params):
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    step = Step.objects.get(run=run)
    started = time.monotonic()
    with connection.execute_wrapper(blink):
        kind = worker.run_step(step.pk)
    assert kind == "step_completed" and failures["left"] == 0
    assert time.monotonic() - started < 5
    assert Step.objects.get(pk=step.pk).status == "completed"
    assert list(Checkpoint.objects.filter(run=run).values_list("kind", flat=True)) == [
        "run_opened", "step_started", "step_completed"]

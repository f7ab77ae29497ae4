"""Schedules: cron and interval slots, missed-slot policies, overlap, and no slot twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from workflows import engine
from workflows.models import Run, Schedule, ScheduleFire
from workflows.timing import schedules

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def schedule(**fields) -> Schedule:
    defaults = {"name": "nightly", "spec_name": "release", "cron": "0 2 * * *"}
    defaults.update(fields)
    item = Schedule(**defaults)
    item.full_clean()
    item.save()
    return item


def test_cron_slots_follow_the_timezone(release_spec):
    item = schedule(cron="0 2 * * *", timezone="Europe/Paris")
    assert schedules.next_slot(item, T0) == datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


def test_interval_slots(release_spec):
    item = schedule(cron="", interval_seconds=600, next_run_at=T0)
    assert schedules.next_slot(item, T0) == T0 + timedelta(minutes=10)
    assert schedules.next_slot(item, T0 + timedelta(minutes=25)) == T0 + timedelta(minutes=30)


@pytest.mark.parametrize(("fields", "message"), [
    ({"cron": "not a cron"}, "not a valid cron expression"),
    ({"cron": "", "interval_seconds": None}, "cron expression or an interval"),
    ({"cron": "* * * * *", "interval_seconds": 60}, "cron expression or an interval"),
    ({"timezone": "Mars/Olympus"}, "Unknown timezone"),
])
def test_invalid_schedules_are_refused(release_spec, fields, message):
    with pytest.raises(ValidationError, match=message):
        schedule(**fields)


def test_due_schedule_starts_one_run_and_advances(release_spec):
    item = schedule(next_run_at=T0)
    report = schedules.tick(T0 + timedelta(seconds=5))
    assert len(report.started) == 1
    run = Run.objects.get()
    assert run.idempotency_key == f"schedule:{item.pk}:{T0.isoformat()}"
    assert run.shared_state["scheduled_for"] == T0.isoformat()
    # The opening checkpoint names the schedule and how many steps the run has.
    opened = run.checkpoints.get(kind="run_opened").evidence
    assert opened["schedule"] == {"id": item.pk, "name": item.name}
    assert opened["steps"] == run.steps_total == len(release_spec.definition["steps"])
    item.refresh_from_db()
    assert item.next_run_at == datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    assert schedules.tick(T0 + timedelta(seconds=6)).started == []


def test_missed_slots_run_once_and_are_counted(release_spec):
    item = schedule(cron="", interval_seconds=3600, next_run_at=T0)
    report = schedules.tick(T0 + timedelta(hours=5, minutes=1))
    assert len(report.started) == 1 and report.missed == 5
    item.refresh_from_db()
    assert item.missed_count == 5 and item.next_run_at == T0 + timedelta(hours=6)
    assert ScheduleFire.objects.get(outcome="started").slot_at == T0 + timedelta(hours=5)
    missed = ScheduleFire.objects.filter(outcome="missed").order_by("slot_at")
    assert [f.slot_at for f in missed] == [T0 + timedelta(hours=h) for h in range(5)]
    assert all("ran for them (missed: run once)" in f.reason for f in missed)


def test_missed_slots_can_be_skipped(release_spec):
    item = schedule(cron="", interval_seconds=3600, next_run_at=T0, missed="skip")
    report = schedules.tick(T0 + timedelta(hours=5, minutes=30))
    assert report.started == [] and report.missed == 5 and report.skipped == 1
    assert not Run.objects.exists()
    item.refresh_from_db()
    assert item.next_run_at == T0 + timedelta(hours=6)
    skipped = ScheduleFire.objects.get(outcome="skipped")
    assert skipped.slot_at == T0 + timedelta(hours=5) and skipped.run is None
    assert "missed: skip" in skipped.reason
    assert ScheduleFire.objects.filter(outcome="missed").count() == 5
    # On time again: it runs.
    assert len(schedules.tick(T0 + timedelta(hours=6, seconds=3)).started) == 1


def test_overlap_skip_waits_for_the_previous_run(release_spec):
    item = schedule(cron="", interval_seconds=60, next_run_at=T0)
    first = schedules.tick(T0).started
    assert len(first) == 1
    assert schedules.tick(T0 + timedelta(seconds=61)).started == []  # previous still open
    engine.cancel_run(first[0])
    assert len(schedules.tick(T0 + timedelta(seconds=121)).started) == 1
    item.refresh_from_db()
    assert item.skipped_count == 1
    skipped = ScheduleFire.objects.get(outcome="skipped")
    assert skipped.reason == f"run {first[0]} was still open (overlap: skip)"


def test_reuse_none_skips_a_slot_whose_key_was_used(release_spec):
    item = schedule(next_run_at=T0, reuse="none")
    key = f"schedule:{item.pk}:{T0.isoformat()}"
    by_hand = engine.open_run(release_spec, idempotency_key=key).run
    engine.cancel_run(by_hand)
    assert schedules.tick(T0 + timedelta(seconds=5)).started == []
    fire = ScheduleFire.objects.get()
    assert fire.outcome == "failed" and f"was used by run {by_hand.pk}" in fire.reason


def test_reuse_any_returns_the_run_that_used_the_key(release_spec):
    item = schedule(next_run_at=T0, reuse="any")
    key = f"schedule:{item.pk}:{T0.isoformat()}"
    # The same request the slot makes (a run started for it by hand, or restored).
    by_hand = engine.open_run(release_spec, idempotency_key=key, title="nightly 2026-12-01 09:00",
                              shared_state={"scheduled_for": T0.isoformat()}).run
    engine.cancel_run(by_hand)
    schedules.tick(T0 + timedelta(seconds=5))
    fire = ScheduleFire.objects.get()
    assert fire.run_id == by_hand.pk and "reuse: any" in fire.reason
    assert Run.objects.count() == 1


def test_a_paused_schedule_says_why_on_its_slot(release_spec):
    from workflows.specs.storage import set_spec_status

    schedule(next_run_at=T0)
    set_spec_status("release", release_spec.version, "archived")
    schedules.tick(T0 + timedelta(seconds=5))
    fire = ScheduleFire.objects.get()
    assert fire.outcome == "skipped" and "has no active version" in fire.reason


def test_overlap_allow_starts_beside_an_open_run(release_spec):
    schedule(cron="", interval_seconds=60, next_run_at=T0, overlap="allow")
    schedules.tick(T0)
    assert len(schedules.tick(T0 + timedelta(seconds=61)).started) == 1
    assert Run.objects.filter(status="open").count() == 2


def test_a_slot_is_never_started_twice_even_after_its_run_closed(release_spec):
    item = schedule(cron="", interval_seconds=60, next_run_at=T0, overlap="allow")
    run_id = schedules.tick(T0).started[0]
    engine.cancel_run(run_id)
    Schedule.objects.filter(pk=item.pk).update(next_run_at=T0)  # as if a restart lost its place
    assert schedules.tick(T0 + timedelta(seconds=1)).started == []
    assert ScheduleFire.objects.count() == 1 and Run.objects.count() == 1


def test_new_schedule_gets_its_first_slot(release_spec):
    item = schedule(cron="*/5 * * * *")
    schedules.tick(T0 + timedelta(minutes=1))
    item.refresh_from_db()
    assert item.next_run_at == T0 + timedelta(minutes=5)


def test_disabled_schedule_does_nothing(release_spec):
    schedule(next_run_at=T0, enabled=False)
    assert schedules.tick(T0 + timedelta(days=3)).started == []


def test_a_schedule_ends_at_its_until(release_spec):
    item = schedule(interval_seconds=3600, cron="", next_run_at=T0, overlap="allow",
                    until=T0 + timedelta(hours=1, minutes=30))
    assert len(schedules.tick(T0 + timedelta(seconds=1)).started) == 1
    assert len(schedules.tick(T0 + timedelta(hours=1, seconds=1)).started) == 1
    item.refresh_from_db()
    # The next slot (T0 + 2 h) is after `until`: the schedule has ended, and says so.
    assert not item.enabled and item.paused_reason.startswith("Ended: no slot after")
    assert schedules.tick(T0 + timedelta(hours=5)).started == []
    assert Run.objects.count() == 2


def test_missed_slots_say_the_policy_that_handled_them(release_spec):
    schedule(interval_seconds=3600, cron="", next_run_at=T0, missed="skip")
    schedules.tick(T0 + timedelta(hours=2, seconds=5))  # two missed, the latest on time
    reasons = set(ScheduleFire.objects.filter(outcome="missed").values_list("reason",
                                                                            flat=True))
    assert reasons and all("(missed: skip)" in reason for reason in reasons), reasons


FLAKY = {"name": "flaky", "steps": [{"key": "work", "title": "Work"}]}


def _fail(run):
    engine.record_transition(run, "work", step_status="failed", summary="broke")


def _no_more_slots():
    """The runs' times are the database's (now, after T0): no later slot gets in the way."""
    Schedule.objects.update(next_run_at=datetime(2099, 1, 1, tzinfo=UTC))


def test_a_failed_slot_is_opened_again_after_its_delay_up_to_its_limit(db):
    """The seed's retryScheduledFor: a slot whose run failed is opened again once the
    schedule's delay has passed, each retry a run of its own under the slot's key, until the
    limit; the slot names its latest run and says which retry it is."""
    from workflows.specs.storage import store_spec

    store_spec(FLAKY)
    item = schedule(spec_name="flaky", next_run_at=T0, retry_limit=2,
                    retry_delay_seconds=600)
    schedules.tick(T0)
    _no_more_slots()
    first = Run.objects.get()
    _fail(first)
    failed_at = Run.objects.get(pk=first.pk).finished_at
    assert schedules.tick(failed_at + timedelta(seconds=599)).started == []  # not yet
    [second_id] = schedules.tick(failed_at + timedelta(seconds=600)).started
    second = Run.objects.get(pk=second_id)
    slot = ScheduleFire.objects.get(schedule=item)
    assert (slot.run_id, slot.retries) == (second.pk, 1)
    assert slot.reason == f"retry 1 of 2: run {first.pk} failed"
    assert second.idempotency_key == f"schedule:{item.pk}:{T0.isoformat()}:retry-1"
    assert (second.shared_state["retry_of"], second.shared_state["retry"]) == (first.pk, 1)
    assert "(retry 1 of 2)" in second.title
    assert schedules.tick(failed_at + timedelta(seconds=601)).started == []  # it is open

    _fail(second)
    later = Run.objects.get(pk=second.pk).finished_at + timedelta(hours=1)
    [third_id] = schedules.tick(later).started
    _fail(Run.objects.get(pk=third_id))
    assert schedules.tick(later + timedelta(days=1)).started == []  # the limit is 2
    slot.refresh_from_db()
    assert (slot.run_id, slot.retries) == (third_id, 2)
    assert Run.objects.count() == 3
    # Every run of the slot, retries included, is the schedule's: on the runs page, in the
    # API and in the admin's latest slots.
    from django.test import Client

    from tests.conftest import make_user
    from workflows.models import ApiToken

    root = make_user("root", is_staff=True, is_superuser=True)
    runs = {first.pk, second.pk, third_id}
    token = ApiToken.objects.issue(root)[1]
    listed = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(
        "/api/runs", {"schedule": item.pk}).json()["results"]
    assert {r["id"] for r in listed} == runs
    admin = Client()
    admin.force_login(root)
    page = admin.get(f"/admin/workflows/schedule/{item.pk}/change/").content.decode()
    assert all(f"#{pk} (failed)" in page for pk in runs)
    runs_page = admin.get("/runs/", {"schedule": item.pk}).content.decode()
    assert all(f'href="/runs/{pk}/"' in runs_page for pk in runs)


def test_a_slot_is_not_opened_again_when_it_succeeded_or_retries_are_off(db):
    from workflows.specs.storage import store_spec

    store_spec(FLAKY)
    off = schedule(name="off", spec_name="flaky", next_run_at=T0)
    on = schedule(name="on", spec_name="flaky", next_run_at=T0, retry_limit=3,
                  retry_delay_seconds=1)
    schedules.tick(T0)
    _no_more_slots()
    runs = {fire.schedule_id: fire.run for fire in ScheduleFire.objects.all()}
    _fail(runs[off.pk])
    engine.record_transition(runs[on.pk], "work", step_status="completed")
    assert schedules.tick(T0 + timedelta(days=1)).started == []
    with pytest.raises(ValidationError, match="needs a delay"):
        schedule(name="bad", spec_name="flaky", retry_limit=1, retry_delay_seconds=0)


def test_the_admin_schedule_form_has_until_and_retries_and_shows_each_slot(admin_client,
                                                                         release_spec):
    item = schedule(next_run_at=T0)
    schedules.tick(T0)
    page = admin_client.get(f"/admin/workflows/schedule/{item.pk}/change/").content.decode()
    for field in ('name="until_0"', 'name="retry_limit"', 'name="retry_delay_seconds"'):
        assert field in page, field
    run = Run.objects.get()
    assert f"#{run.pk}" in page and "Started (open)" in page


def test_upcoming_slots_follow_the_schedule_and_stop_at_its_end(release_spec):
    item = schedule(cron="0 2 * * *", timezone="Europe/Paris", next_run_at=None,
                    until=datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    assert schedules.upcoming_slots(item, T0) == [datetime(2026, 12, 2, 1, 0, tzinfo=UTC),
                                                  datetime(2026, 12, 3, 1, 0, tzinfo=UTC)]
    item.enabled = False
    assert schedules.upcoming_slots(item, T0) == []


def test_the_admin_change_page_says_when_the_next_runs_start_or_why_none(admin_client,
                                                                         release_spec):
    item = schedule(cron="30 6 * * *", timezone="Asia/Tokyo")
    page = admin_client.get(f"/admin/workflows/schedule/{item.pk}/change/").content.decode()
    assert "Next runs" in page
    assert page.count("06:30 Asia/Tokyo (in ") == 3, page

    Schedule.objects.filter(pk=item.pk).update(enabled=False)
    page = admin_client.get(f"/admin/workflows/schedule/{item.pk}/change/").content.decode()
    assert "none: the schedule is disabled" in page

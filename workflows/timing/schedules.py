"""Schedules start runs on a cron expression or an interval.

Every slot is started at most once: the schedule row is locked while it is advanced, and a
ScheduleFire row per slot is unique in the database, so two sweepers or a restart cannot start
a slot twice. Slots missed while nothing was running are counted and either run once (for the
latest missed slot) or skipped, as the schedule says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from workflows import engine
from workflows.models import (
    OPEN_RUN_STATUSES,
    FireOutcome,
    MissedPolicy,
    OverlapPolicy,
    RunStatus,
    Schedule,
    ScheduleFire,
    SpecStatus,
    WorkflowSpec,
)
from workflows.models.schedules import validate_schedule
from workflows.people import permissions
from workflows.specs.storage import require_program_author
from workflows.timing import clock

MAX_SLOTS = 10_000  # a schedule asleep for years is counted up to here, not forever


log = logging.getLogger(__name__)


def require_schedule_rights(schedule: Schedule, *, actor) -> None:
    """A schedule starts runs on its author's say: creating or enabling one (or changing
    what an enabled one starts) needs add_run, and author_command_spec when its spec runs
    programs. Disabling needs neither. The system (None or a name) may."""

    if not permissions.is_person(actor):
        return
    before = Schedule.objects.filter(pk=schedule.pk).values(
        "enabled", "spec_name").first() if schedule.pk else None
    starts_runs = schedule.enabled and (before is None or not before["enabled"]
                                        or before["spec_name"] != schedule.spec_name)
    if before is not None and not starts_runs:
        return
    name = actor.get_username() or "anonymous"
    if not permissions.has(actor, permissions.START):
        raise engine.NotPermitted(f"{name} may not schedule runs: that needs the add_run "
                                  "permission.")
    spec = (WorkflowSpec.objects.filter(name=schedule.spec_name)
            .order_by("status", "-version").first())
    if spec is not None:
        require_program_author(actor, spec.definition)


def save_schedule(schedule: Schedule, *, actor=None) -> Schedule:
    """Check who may, validate, and save a schedule (the admin and any other entry point)."""
    require_schedule_rights(schedule, actor=actor)
    validate_schedule(schedule)
    schedule.save()
    return schedule


def next_slot(schedule: Schedule, after: datetime) -> datetime:
    """The first slot strictly after `after`, as an aware UTC datetime."""
    if schedule.interval_seconds:
        anchor = schedule.next_run_at or schedule.created_at
        if after < anchor:
            return anchor
        steps = int((after - anchor).total_seconds() // schedule.interval_seconds) + 1
        return anchor + timedelta(seconds=steps * schedule.interval_seconds)
    local = after.astimezone(ZoneInfo(schedule.timezone))
    return croniter(schedule.cron, local).get_next(datetime).astimezone(ZoneInfo("UTC"))


def upcoming_slots(schedule: Schedule, now: datetime, count: int = 3) -> list[datetime]:
    """The next `count` slots the schedule would start from `now` on, as it stands (none
    when it is disabled; none past its `until`). A slot already due is the first."""
    if not schedule.enabled or not (schedule.cron or schedule.interval_seconds):
        return []
    slot = schedule.next_run_at or next_slot(schedule, now)
    slots = []
    while len(slots) < count and not (schedule.until and slot > schedule.until):
        slots.append(slot)
        slot = next_slot(schedule, slot)
    return slots


@dataclass
class TickReport:
    started: list[int] = field(default_factory=list)
    skipped: int = 0
    missed: int = 0


def tick(now: datetime | None = None) -> TickReport:
    """Start the runs of every due schedule."""
    now = now or clock.now()
    report = TickReport()
    due = Schedule.objects.filter(enabled=True, next_run_at__lte=now).values_list("pk",
                                                                                  flat=True)
    for schedule_id in list(due[:500]):
        try:
            fire(schedule_id, now, report)
        except Exception:  # one broken schedule must not stop the others
            log.exception("Could not start schedule %s", schedule_id)
    for fire_id in due_retries(now):
        try:
            retry(fire_id, now, report)
        except Exception:
            log.exception("Could not open slot %s again", fire_id)
    # A new schedule gets its first slot here.
    for schedule in Schedule.objects.filter(enabled=True, next_run_at__isnull=True)[:500]:
        Schedule.objects.filter(pk=schedule.pk, next_run_at__isnull=True).update(
            next_run_at=next_slot(schedule, now))
    return report


def fire(schedule_id: int, now: datetime, report: TickReport) -> None:
    with transaction.atomic():
        schedule = (Schedule.objects.select_for_update(of=("self",))
                    .select_related("last_run", "goal")
                    .filter(pk=schedule_id, enabled=True, next_run_at__lte=now).first())
        if schedule is None:
            return  # another sweeper advanced it first
        if not WorkflowSpec.objects.filter(name=schedule.spec_name,
                                           status=SpecStatus.ACTIVE).exists():
            schedule.enabled = False
            schedule.paused_reason = (f"Paused {now:%Y-%m-%d %H:%M}: spec "
                                      f"{schedule.spec_name!r} has no active version")
            schedule.save(update_fields=["enabled", "paused_reason"])
            _record(schedule, [schedule.next_run_at], FireOutcome.SKIPPED,
                    schedule.paused_reason[:300])
            report.skipped += 1
            return
        slots = [schedule.next_run_at]
        while len(slots) < MAX_SLOTS:
            following = next_slot(schedule, slots[-1])
            if following > now or (schedule.until and following > schedule.until):
                break
            slots.append(following)
        if schedule.until and slots[0] > schedule.until:
            _end(schedule)
            return
        latest, missed = slots[-1], len(slots) - 1
        late = (now - latest).total_seconds() > 2 * settings.TOLLGATE_SWEEP_SECONDS + 60
        schedule.missed_count += missed
        report.missed += missed
        run_it = schedule.missed == MissedPolicy.RUN_ONCE or not late
        _record(schedule, slots[:-1], FireOutcome.MISSED,
                f"missed while no consumer ran; the slot of {latest:%Y-%m-%d %H:%M} "
                + ("ran for them (missed: run once)" if schedule.missed == MissedPolicy.RUN_ONCE
                   else "ran on time, these were skipped (missed: skip)" if run_it
                   else "was skipped too (missed: skip)"))
        why = "" if run_it else "late and the schedule skips missed slots (missed: skip)"
        previous = schedule.last_run
        if run_it and schedule.overlap == OverlapPolicy.SKIP and previous and (
            previous.status in OPEN_RUN_STATUSES
        ):
            run_it = False
            why = f"run {previous.pk} was still {previous.status} (overlap: skip)"
        if run_it:
            run_id = _start(schedule, latest)
            if run_id:
                report.started.append(run_id)
        else:
            _record(schedule, [latest], FireOutcome.SKIPPED, why)
            schedule.skipped_count += 1
            report.skipped += 1
        schedule.next_run_at = next_slot(schedule, max(latest, now))
        schedule.save(update_fields=["next_run_at", "missed_count", "skipped_count",
                                     "last_run"])
        if schedule.until and schedule.next_run_at > schedule.until:
            _end(schedule)


RETRY_WINDOW = timedelta(days=7)  # older slots are not looked at again


def due_retries(now: datetime, limit: int = 200) -> list[int]:
    """Slots whose run failed, of enabled schedules with retries left, whose delay has
    passed (the seed's retryScheduledFor): the last week's, oldest failure first."""
    fires = (ScheduleFire.objects.filter(
        slot_at__gte=now - RETRY_WINDOW, schedule__enabled=True,
        schedule__retry_limit__gt=F("retries"), run__status=RunStatus.FAILED)
        .order_by("run__finished_at")
        .values_list("pk", "run__finished_at", "schedule__retry_delay_seconds")[:limit])
    return [pk for pk, failed_at, delay in fires
            if failed_at and failed_at + timedelta(seconds=delay) <= now]


def retry(fire_id: int, now: datetime, report: TickReport) -> int | None:
    """Open a failed slot's run again (one more of its schedule's retries), as a new run
    under the slot's key with the retry's number; the slot then names that run."""
    with transaction.atomic():
        fired = (ScheduleFire.objects.select_for_update(of=("self",))
                 .select_related("schedule", "run", "schedule__goal")
                 .filter(pk=fire_id, run__status=RunStatus.FAILED).first())
        schedule = fired.schedule if fired else None
        if fired is None or fired.retries >= schedule.retry_limit or not schedule.enabled:
            return None  # another tick took it, or nothing is left to do
        failed, number = fired.run, fired.retries + 1
        try:
            with transaction.atomic():
                opened = _open(schedule, fired.slot_at, retry=number,
                               state={"retry_of": failed.pk, "retry": number})
        except engine.WorkflowError as exc:
            fired.retries = number
            fired.reason = f"retry {number} not opened: {exc}"[:300]
            fired.save(update_fields=["retries", "reason"])
            return None
        fired.run, fired.retries = opened.run, number
        fired.reason = (f"retry {number} of {schedule.retry_limit}: run {failed.pk} "
                        f"failed")[:300]
        fired.save(update_fields=["run", "retries", "reason"])
    report.started.append(opened.run.pk)
    return opened.run.pk


def _end(schedule: Schedule) -> None:
    """The schedule's `until` has passed: it starts nothing more, and says so."""
    schedule.enabled = False
    schedule.paused_reason = f"Ended: no slot after {schedule.until:%Y-%m-%d %H:%M %Z} (until)"
    schedule.save(update_fields=["enabled", "paused_reason"])


def _record(schedule: Schedule, slots: list[datetime], outcome: str, reason: str) -> None:
    """Slots that started no run, each with why (a slot handled already is left as it is)."""
    if slots:
        ScheduleFire.objects.bulk_create(
            [ScheduleFire(schedule=schedule, slot_at=slot, outcome=outcome, reason=reason[:300])
             for slot in slots], ignore_conflicts=True)


def slot_key(schedule_id: int, slot: datetime) -> str:
    """The idempotency key of a schedule's slot: `schedule:ID:SLOT`."""
    return f"schedule:{schedule_id}:{slot.isoformat()}"


def slot_of(key: str) -> tuple[str, str] | None:
    """(schedule id, slot) of a slot's key (`slot_key`), or None for any other key."""
    prefix, _, rest = (key or "").partition(":")
    schedule, _, slot = rest.partition(":")
    return (schedule, slot) if prefix == "schedule" and schedule and slot else None


def _open(schedule: Schedule, slot: datetime, *, retry: int = 0, state=None):
    """The run of a schedule's slot (`retry`: the slot opened again, that many times), under
    the slot's key, its goal while the goal is open."""
    goal = schedule.goal if schedule.goal and not schedule.goal.is_closed else None
    key, title = slot_key(schedule.pk, slot), f"{schedule.name} {slot:%Y-%m-%d %H:%M}"
    if retry:
        key, title = f"{key}:retry-{retry}", f"{title} (retry {retry} of {schedule.retry_limit})"
    return engine.open_run(
        schedule.spec_name, actor=f"schedule {schedule.name}", goal=goal, idempotency_key=key,
        shared_state={**schedule.shared_state, "scheduled_for": slot.isoformat(),
                      **(state or {})},
        title=title, params=schedule.params or None, reuse=schedule.reuse, schedule=schedule)


def _start(schedule: Schedule, slot: datetime) -> int | None:
    try:
        with transaction.atomic():
            fired = ScheduleFire.objects.create(schedule=schedule, slot_at=slot)
            opened = _open(schedule, slot)
            fired.run = opened.run
            if opened.reused:
                fired.reason = f"its key was used already: run {opened.run.pk} (reuse: " \
                               f"{schedule.reuse})"
            fired.save(update_fields=["run", "reason"])
    except IntegrityError:
        return None  # this slot was started already
    except engine.WorkflowError as exc:
        # Spec archived or gone, params refused, key used (reuse none): the slot passes
        # with its reason, and the schedule keeps its place.
        _record(schedule, [slot], FireOutcome.FAILED, str(exc))
        return None
    schedule.last_run = opened.run
    return opened.run.pk

"""Deadlines: gates past theirs are rejected or escalated, wait steps fail or are skipped;
and the reminders before them."""

from __future__ import annotations

import logging

from workflows import engine
from workflows.models import Step, StepKind, StepStatus
from workflows.timing import clock

log = logging.getLogger(__name__)


def apply(now=None, limit: int = 1000) -> int:
    """Expire every overdue gate, by the database's own clock; served by the partial index on
    waiting gates' deadlines."""
    now = now or clock.database_now()
    overdue = (Step.objects.filter(status=StepStatus.WAITING_APPROVAL, deadline_at__lte=now)
               .order_by("deadline_at").values_list("pk", flat=True)[:limit])
    waits = (Step.objects.filter(kind=StepKind.WAIT, deadline_at__lte=now)
             .order_by("deadline_at").values_list("pk", flat=True)[:limit])
    done = 0
    for expire, step_ids in ((engine.expire_gate, list(overdue)),
                             (engine.expire_wait, list(waits))):
        for step_id in step_ids:
            try:
                done += bool(expire(step_id))
            except Exception:  # one bad row must not hold every other deadline back
                log.exception("Could not apply the deadline of step %s", step_id)
    return done


def remind(now=None, limit: int = 1000) -> int:
    """Send every reminder that is due, by the database's own clock; served by the partial
    index on gates' reminders."""
    now = now or clock.database_now()
    due = list(Step.objects.filter(status=StepStatus.WAITING_APPROVAL, remind_at__lte=now)
               .order_by("remind_at").values_list("pk", flat=True)[:limit])
    done = 0
    for step_id in due:
        try:
            done += bool(engine.remind_gate(step_id))
        except Exception:
            log.exception("Could not remind the approvers of step %s", step_id)
    return done

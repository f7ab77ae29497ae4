"""Prometheus metrics (/metrics), multiprocess-safe: web processes and Huey consumers each
write their counters and histograms to PROMETHEUS_MULTIPROC_DIR (settings set it), and a
scrape adds them up. Transitions are counted from the engine's `transition_committed`
signal (the engine imports nothing of this); what is a state rather than an event (steps
waiting for a worker, gates waiting, deliveries, the periodic tasks' last runs) is read from
the database at scrape time, in a few queries."""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import socket
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min, Q
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from workflows.engine import processes
from workflows.models import (
    OPEN_RUN_STATUSES,
    CheckpointKind,
    Notification,
    OutboxMessage,
    PeriodicRun,
    Run,
    Step,
    StepStatus,
    WebhookDelivery,
    Worker,
)
from workflows.recovery.presence import sweeper_late
from workflows.timing import clock

log = logging.getLogger(__name__)


@functools.cache
def _host_and_namespace() -> str:
    namespace = re.sub(r"\D", "", processes.pid_namespace()) or "ns"
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}-{namespace}"


def process_identifier() -> str:
    """Names this process's metrics files apart from every other's sharing the folder:
    processes in containers are all pid 1 in pid namespaces of their own, on hosts of their
    own names (`counter_web-1-4026532410-1.db`). prometheus_client asks it at every count,
    to notice a fork: only the pid is read each time."""
    return f"{_host_and_namespace()}-{os.getpid()}"


def _values_kept_apart():
    """The value class metrics are made with: files per process (process_identifier); and a
    process whose file cannot be opened (corrupt, a full disk) counts in memory rather than
    dying at import: its counts are missing from /metrics, and it says so once."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return values.ValueClass
    in_files = values.MultiProcessValue(process_identifier=process_identifier)
    warned = []

    def value(*args, **kwargs):
        try:
            return in_files(*args, **kwargs)
        except Exception:  # a metrics file must never stop the process
            if not warned:
                warned.append(True)
                log.warning("Metrics file of process %s could not be used; its counts stay "
                            "in memory", process_identifier(), exc_info=True)
            return values.MutexValue(*args, **kwargs)

    return value


values.ValueClass = _values_kept_apart()

STEP_EVENTS = {
    CheckpointKind.STEP_STARTED: "started", CheckpointKind.STEP_COMPLETED: "completed",
    CheckpointKind.STEP_FAILED: "failed", CheckpointKind.STEP_RETRYING: "retrying",
    CheckpointKind.STEP_SKIPPED: "skipped",
}
steps = Counter("tollgate_steps_total", "Step transitions, by spec, step kind and event",
                ["spec", "kind", "event"])
step_seconds = Histogram("tollgate_step_duration_seconds",
                         "How long a step's attempt ran, started to finished",
                         ["spec", "kind"],
                         buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400))
claim_seconds = Histogram("tollgate_claim_latency_seconds",
                          "From a step's doorbell to a worker starting it",
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120))
gate_events = Counter("tollgate_gate_events_total",
                      "Gate decisions, reminders and what deadlines did", ["event"])
lease_events = Counter("tollgate_lease_events_total",
                       "Leases reclaimed, noted overdue, and stale results", ["event"])
GATE_EVENTS = {
    CheckpointKind.APPROVAL_RECORDED: "approval", CheckpointKind.STEP_APPROVED: "approved",
    CheckpointKind.STEP_REJECTED: "rejected", CheckpointKind.GATE_ESCALATED: "escalated",
    CheckpointKind.GATE_TIMED_OUT: "timed_out", CheckpointKind.GATE_REMINDED: "reminded",
}
LEASE_EVENTS = {
    CheckpointKind.LEASE_RECOVERED: "expired", CheckpointKind.LEASE_OVERDUE: "overdue",
    CheckpointKind.STALE_RESULT: "stale_result",
}


def on_transition(sender, announcement, **kwargs) -> None:
    """Count a committed transition (never lets a metrics error reach the engine)."""
    try:
        checkpoint = announcement.checkpoint
        kind = checkpoint.kind
        step = checkpoint.step if checkpoint.step_id else None
        spec = checkpoint.run.spec_name
        if kind in STEP_EVENTS and step is not None:
            steps.labels(spec, step.kind, STEP_EVENTS[kind]).inc()
            if kind in (CheckpointKind.STEP_COMPLETED, CheckpointKind.STEP_FAILED) and (
                    step.started_at and step.finished_at):
                step_seconds.labels(spec, step.kind).observe(
                    max((step.finished_at - step.started_at).total_seconds(), 0))
            if kind == CheckpointKind.STEP_STARTED and step.rung_at:
                claim_seconds.observe(max((checkpoint.at - step.rung_at).total_seconds(), 0))
        elif kind in GATE_EVENTS:
            gate_events.labels(GATE_EVENTS[kind]).inc()
        elif kind in LEASE_EVENTS:
            lease_events.labels(LEASE_EVENTS[kind]).inc()
    except Exception:  # a metric must never break a transition's aftermath
        log.exception("Could not count a transition")


class DatabaseState:
    """What is true now, read at scrape time."""

    def collect(self):
        from workflows.ops.operations import readiness

        checks = readiness()
        ready = GaugeMetricFamily("tollgate_ready", "1 when each of what the app needs "
                                  "answers (the database, its schema, the queue)",
                                  labels=["check"])
        for name, state in checks.items():
            ready.add_metric([name], 1 if state == "ok" else 0)
        yield ready
        if checks["database"] != "ok":
            return  # nothing else can be read; the alerts read tollgate_ready
        yield from self.state()

    def state(self):
        now = clock.now()
        open_runs = Q(run__status__in=OPEN_RUN_STATUSES)
        ready = GaugeMetricFamily("tollgate_steps_ready",
                                  "Steps waiting for a worker, by the run's priority rank",
                                  labels=["priority"])
        for rank, count in (Step.objects.filter(open_runs, status__in=(
                StepStatus.PENDING, StepStatus.RETRYING), kind="run", waiting_on=0)
                .values_list("run__priority_rank").annotate(n=Count("pk")).order_by()):
            ready.add_metric([str(rank)], count)
        yield ready
        gates = Step.objects.filter(open_runs, status=StepStatus.WAITING_APPROVAL).aggregate(
            n=Count("pk"), oldest=Min("waiting_since"),
            overdue=Count("pk", filter=Q(deadline_at__lt=now)))
        yield GaugeMetricFamily("tollgate_gates_waiting", "Gates waiting for a decision",
                                value=gates["n"])
        yield GaugeMetricFamily("tollgate_gates_oldest_wait_seconds",
                                "How long the oldest waiting gate has waited",
                                value=(now - gates["oldest"]).total_seconds()
                                if gates["oldest"] else 0)
        yield GaugeMetricFamily("tollgate_gates_overdue", "Waiting gates past their deadline",
                                value=gates["overdue"])
        yield GaugeMetricFamily(
            "tollgate_leases_overdue", "Running steps whose lease ran out (holder alive)",
            value=Step.objects.filter(status=StepStatus.RUNNING,
                                      lease_expires_at__lt=now).count())
        yield GaugeMetricFamily("tollgate_runs_open", "Runs not yet ended",
                                value=Run.objects.filter(status__in=OPEN_RUN_STATUSES).count())
        deliveries = GaugeMetricFamily("tollgate_webhook_deliveries",
                                       "Webhook deliveries kept, by status", labels=["status"])
        for status, count in (WebhookDelivery.objects.values_list("status")
                              .annotate(n=Count("pk")).order_by()):
            deliveries.add_metric([status], count)
        yield deliveries
        mail = Notification.objects.aggregate(
            sent=Count("pk", filter=Q(sent_at__isnull=False)),
            failed=Count("pk", filter=~Q(error="")))
        mails = GaugeMetricFamily("tollgate_mails", "Notification mails kept, sent or failed",
                                  labels=["outcome"])
        mails.add_metric(["sent"], mail["sent"])
        mails.add_metric(["failed"], mail["failed"])
        yield mails
        last = GaugeMetricFamily("tollgate_periodic_last_run_seconds_ago",
                                 "Seconds since each periodic task last finished",
                                 labels=["task"])
        took = GaugeMetricFamily("tollgate_periodic_duration_seconds",
                                 "How long each periodic task's last run took", labels=["task"])
        failed = GaugeMetricFamily("tollgate_periodic_failed",
                                   "1 when a periodic task's last run failed (verify_audit: "
                                   "a chain or seal did not verify)", labels=["task"])
        for run in PeriodicRun.objects.all():
            if run.last_finished:
                last.add_metric([run.name], (now - run.last_finished).total_seconds())
            if run.last_seconds is not None:
                took.add_metric([run.name], run.last_seconds)
            failed.add_metric([run.name], 1 if run.last_error else 0)
        yield last
        yield took
        yield failed

        yield GaugeMetricFamily("tollgate_sweeper_late",
                                "1 when no sweep has finished for three periods",
                                value=1 if sweeper_late(now) else 0)
        quiet = now - timedelta(seconds=3 * settings.TOLLGATE_SWEEP_SECONDS)
        yield GaugeMetricFamily("tollgate_consumers_alive",
                                "Consumer processes that reported within three sweep periods",
                                value=Worker.objects.filter(last_seen__gte=quiet).count())
        outbox = OutboxMessage.objects.filter(done_at=None).aggregate(
            n=Count("pk"), oldest=Min("created_at"))
        yield GaugeMetricFamily("tollgate_outbox_pending",
                                "What transitions owe the outside world, not yet delivered",
                                value=outbox["n"])
        yield GaugeMetricFamily("tollgate_outbox_oldest_seconds",
                                "How long the oldest undelivered outbox message has waited",
                                value=(now - outbox["oldest"]).total_seconds()
                                if outbox["oldest"] else 0)


def scrape() -> bytes:
    """Every process's counters and histograms, added up, and the database's state."""
    registry = CollectorRegistry()
    registry.register(ProcessFiles())
    registry.register(DatabaseState())
    return generate_latest(registry)


class ProcessFiles:
    """Every process's metrics files, added up; a file that cannot be read (cut short by a
    crash) is left out and logged, and the rest are still served."""

    def collect(self):
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
        files = sorted(glob.glob(os.path.join(folder, "*.db"))) if folder else []
        try:
            return MultiProcessCollector.merge(files, accumulate=True)
        except Exception:  # one bad file: find it
            readable = []
            for name in files:
                try:
                    MultiProcessCollector.merge([name], accumulate=True)
                    readable.append(name)
                except Exception:
                    log.warning("Metrics file %s cannot be read; left out", name)
            return MultiProcessCollector.merge(readable, accumulate=True)

"""What a Huey worker does with a doorbell: claim the step, run it under a lease, report."""

from __future__ import annotations

import logging
import os
import socket
import threading
from contextlib import contextmanager

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from . import engine
from .executors import execute
from .models import Run, RunStatus, Step, StepStatus

log = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


@contextmanager
def heartbeat(step_id: int, token: str, lease_seconds: float):
    """Renew the lease every third of its length; set the yielded event once it is lost.

    A lost lease means the sweeper gave the step away or the run was cancelled: the
    executor then stops its process.
    """
    lost = threading.Event()
    done = threading.Event()

    def beat() -> None:
        try:
            while not done.wait(lease_seconds / 3):
                if not engine.renew_lease(step_id, token, lease_seconds):
                    lost.set()
                    return
        finally:
            connections.close_all()  # this thread's own connection, if it opened one

    thread = threading.Thread(target=beat, name=f"heartbeat-{step_id}", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        done.set()
        thread.join()


def run_step(step_id: int) -> str:
    """Claim and execute one step; returns what happened, for logs and tests."""
    owner = worker_name()
    try:
        step = engine.claim_step(step_id, owner=owner,
                                 lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
    except engine.NotFound:
        return "missing"
    except engine.WorkflowError as exc:
        # Taken by another worker, not due, or the run moved on: the doorbell was stale.
        log.info("Step %s not started: %s", step_id, exc)
        return "not-ready"
    return _execute(step, owner)


def _execute(step: Step, owner: str) -> str:
    """Run a claimed step under its lease and report the outcome with the lease token."""
    context = {"run_id": step.run_id, "step_key": step.key, "attempt": step.attempt}
    with heartbeat(step.pk, step.lease_token, settings.TOLLGATE_LEASE_SECONDS) as lost:
        outcome = execute(step.config["run"], context=context,
                          shared_state=step.run.shared_state, stop=lost)
    actor = f"worker {owner}"
    if outcome.ok:
        checkpoint = engine.complete_step(
            step.run_id, step.key, actor=actor, summary=outcome.summary,
            evidence=outcome.evidence, state_patch=outcome.state_patch,
            lease_token=step.lease_token)
    else:
        checkpoint = engine.fail_step(
            step.run_id, step.key, actor=actor, summary=outcome.summary,
            evidence=outcome.evidence, lease_token=step.lease_token,
            retryable=outcome.retryable)
    return checkpoint.kind


def compensate_run(run_id: int) -> list[str]:
    """Run the compensation of each completed step of a failed run, latest completion first."""
    done = []
    steps = (Step.objects.filter(run_id=run_id, status=StepStatus.COMPLETED,
                                 compensation__isnull=False, compensated_at__isnull=True)
             .order_by("-finished_at", "-index"))
    for step in steps:
        with transaction.atomic():
            # Claim first so that a duplicate message cannot run it twice.
            claimed = Step.objects.filter(pk=step.pk, compensated_at__isnull=True).update(
                compensated_at=timezone.now())
        if not claimed:
            continue
        run = Run.objects.only("shared_state", "status").get(pk=run_id)
        if run.status != RunStatus.FAILED:
            Step.objects.filter(pk=step.pk).update(compensated_at=None)
            break  # retried meanwhile: no longer ours to undo
        context = {"run_id": run_id, "step_key": step.key, "attempt": step.attempt}
        outcome = execute(step.compensation, context=context, shared_state=run.shared_state,
                          stop=threading.Event())
        engine.record_compensation(run_id, step.key, ok=outcome.ok, summary=outcome.summary,
                                   evidence=outcome.evidence)
        done.append(step.key)
    return done

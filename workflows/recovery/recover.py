"""Recover a run now: check each running step's holder and reclaim what is dead.

What the sweeper does on its rounds, for one run, on an operator's request (`manage.py
recover`, `POST /api/runs/{id}/recover`, the run page's Recover button).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from workflows import engine
from workflows.engine import processes
from workflows.models import Run, Step, StepStatus
from workflows.timing import clock
from workflows.workers import worker


@dataclass
class Verdict:
    step: str
    holder: str  # alive, gone or unknown
    action: str  # what recover did


def recover_run(run: Run | int, *, actor) -> list[Verdict]:
    """Check every running step of the run; reclaim those whose holder is gone."""
    engine.require_operator(actor, "recover runs")
    run_id = run.pk if isinstance(run, Run) else run
    if not Run.objects.filter(pk=run_id).exists():
        raise engine.NotFound(f"Run {run_id} does not exist.")
    worker.record_orphans(force=True)  # a finished result is recorded, not run again
    verdicts = []
    now = clock.now()
    for step in Step.objects.filter(run_id=run_id, status=StepStatus.RUNNING).order_by("index"):
        if step.child_run_id:
            checkpoint = engine.children.child_ended(step.child_run_id)
            verdicts.append(Verdict(step.key, "none", f"ended with its child run "
                                    f"{step.child_run_id}" if checkpoint else
                                    f"left alone: waits for its child run {step.child_run_id}"))
            continue
        if not step.lease_token and "workflow" in (step.config.get("run") or {}):
            checkpoint = engine.children.child_gone(run_id, step.key, actor=actor)
            verdicts.append(Verdict(step.key, "none", "failed: its child run is gone"
                                    if checkpoint else "already moved on"))
            continue
        if not step.lease_token:
            verdicts.append(Verdict(step.key, "none", "left alone: an agent reports it"))
            continue
        state = processes.holder_state(step.holder_host, step.holder_boot_id, step.holder_pid,
                                       step.holder_started, step.holder_pidns)
        if state == processes.ALIVE:
            verdicts.append(Verdict(step.key, state, "left alone: its worker is alive"))
            continue
        if state == processes.UNKNOWN:
            verdicts.append(Verdict(step.key, state, "left alone: its worker is on another "
                                                     "machine or in another container; the "
                                                     "sweeper reclaims it after its lease "
                                                     "and kill grace"))
            continue
        _kill_leftovers(step)
        # The holder is gone: its lease is void now, not when it would have run out.
        Step.objects.filter(pk=step.pk, lease_token=step.lease_token).update(lease_expires_at=now)
        checkpoint = engine.expire_lease(
            step.pk, actor=actor,
            why=f"Recovered: the worker holding it ({step.holder_host} pid {step.holder_pid}) "
                "is gone")
        verdicts.append(Verdict(step.key, state, checkpoint.get_kind_display() if checkpoint
                                else "already moved on"))
    return verdicts


def _kill_leftovers(step: Step) -> None:
    """A command whose worker and supervisor both died could still run: stop its group."""
    # Never a process group recorded in another pid namespace: there it names another group.
    if step.child_pgid and processes.local(step.holder_boot_id, step.holder_pidns):
        try:
            os.killpg(step.child_pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

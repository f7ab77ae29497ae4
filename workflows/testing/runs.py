"""A run's worker steps run in the test's own process, as a consumer runs them: each claimed,
executed (its command, callable or agent) and recorded through the engine."""

from __future__ import annotations

from workflows import engine
from workflows.models import Run, Step, StepStatus


def run_to_next_gate(run, *, limit: int = 1000) -> list[Step]:
    """Run the run's ready steps until none is ready (a gate waits, a retry is not due yet,
    or the run ended); the gates waiting then, in spec order. At most `limit` steps."""
    from workflows.workers import worker

    run_id = run.pk if isinstance(run, Run) else int(run)
    for _ in range(limit):
        current = Run.objects.get(pk=run_id)
        ready = engine.ready_steps(current, current.steps.order_by("index"))
        if not ready:
            break
        worker.run_step(ready[0].pk)
    return list(Step.objects.filter(run_id=run_id, status=StepStatus.WAITING_APPROVAL)
                .order_by("index"))

"""Reads shared by pages, the API and commands: run lists, timelines, where a run stands."""

from __future__ import annotations

from django.db.models import Count, F, QuerySet, Value
from django.db.models.functions import Coalesce

from .engine import NotFound
from .engine.rules import next_move, ready_steps
from .models import Approval, Checkpoint, Decision, Run, RunStatus, SpecStatus, WorkflowSpec
from .permissions import decidable_by


def inbox_count(user) -> int:
    return decidable_by(user).count()


def runs(*, status: str = "", spec: str = "", goal: int | None = None) -> QuerySet[Run]:
    """Runs, newest first, filtered as the runs page and `GET /api/runs` ask."""
    found = Run.objects.select_related("spec", "goal", "requested_by").order_by("-created_at",
                                                                               "-id")
    if status in RunStatus.values:
        found = found.filter(status=status)
    if spec:
        found = found.filter(spec_name=spec)
    if goal is not None:
        found = found.filter(goal_id=goal)
    return found


def timeline(run: Run, *, first_seq: int = 1) -> list[Checkpoint]:
    """A run's checkpoints from `first_seq`, oldest first, each with its step's `step_key`."""
    return list(run.checkpoints.filter(seq__gte=first_seq)
                .annotate(step_key=Coalesce(F("step__key"), Value("")))
                .order_by("seq"))


def resume_state(run) -> dict:
    """Where a run stands and what would move it on, for scripts and agents.

    The move is the engine's own `next_move`, the rule behind the run's next action.
    """
    run_id = run.pk if isinstance(run, Run) else run
    run = Run.objects.filter(pk=run_id).first() if str(run_id).isdigit() else None
    if run is None:
        raise NotFound(f"Run {run_id} does not exist.")

    def answer(state, can, step=None, message=""):
        return {"resume_state": state, "can_resume": can,
                "next_step": step.key if step else None, "message": message}

    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")
    steps = list(run.steps.order_by("index"))
    ready = ready_steps(run, steps)
    move, step = next_move(steps, ready[0] if ready else None)
    if move == "retry_available":
        return answer(move, True, step, f"{step.title} failed ({step.last_summary or 'no '
                      'reason given'}); retry it to resume the run.")
    if move == "waiting_approval":
        count = Approval.objects.filter(step=step, attempt=step.attempt,
                                        decision=Decision.APPROVE).count()
        return answer(move, False, step, f"{step.title} waits for "
                      f"{step.approval_required - count} more approval(s) from the "
                      f"{step.approval_group} group.")
    if move == "running":
        return answer(move, False, step, f"{step.title} is running (attempt {step.attempt}).")
    if move == "retrying":
        return answer("running", False, step,
                      f"{step.title} retries at {step.retry_after:%Y-%m-%d %H:%M:%S}.")
    if move == "blocked":
        return answer(move, True, step, f"{step.title} is blocked: "
                      f"{step.last_summary or 'no reason given'}.")
    if move == "ready":
        return answer(move, True, step, f"{step.title} is ready to start.")
    return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")


def active_specs() -> list[dict]:
    """Active specs by name, with how many versions and runs each has (three queries)."""
    active = list(WorkflowSpec.objects.filter(status=SpecStatus.ACTIVE).order_by("name"))
    names = [spec.name for spec in active]
    versions = dict(WorkflowSpec.objects.filter(name__in=names).values_list("name")
                    .annotate(n=Count("pk")).order_by())
    runs_by_name = dict(Run.objects.filter(spec_name__in=names).values_list("spec_name")
                        .annotate(n=Count("pk")).order_by())
    return [{"name": spec.name, "version": spec.version, "description": spec.description,
             "versions": versions.get(spec.name, 0), "runs": runs_by_name.get(spec.name, 0)}
            for spec in active]


def spec_detail(name: str) -> dict | None:
    """A spec's versions, newest first, each with its definition and how many runs it has."""
    versions = list(WorkflowSpec.objects.filter(name=name).annotate(run_count=Count("runs"))
                    .order_by("-version"))
    if not versions:
        return None
    active = next((v.version for v in versions if v.status == SpecStatus.ACTIVE), None)
    return {"name": name, "active_version": active, "versions": [
        {"version": v.version, "status": v.status, "created_at": v.created_at,
         "runs": v.run_count, "definition": v.definition} for v in versions]}

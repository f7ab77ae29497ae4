"""Production-size data for the pages section: goal trees, runs and their checkpoints.

Rows are copies of runs the engine itself made (one finished, one waiting at its gate), so
every page reads rows as the engine writes them; only their number is the bench's.
"""

from __future__ import annotations

import itertools

BATCH = 2_000  # runs per round of inserts


def grow_goals(total: int):
    """A root, total // 100 teams under it and 99 goals under each team; returns the root
    and the leaves."""
    from goals import tree
    from goals.models import Goal

    root = Goal.objects.create(title=f"Bench root {total}")
    teams = Goal.objects.bulk_create(Goal(title=f"Team {i}", parent=root)
                                     for i in range(max(total // 100, 1)))
    leaves = Goal.objects.bulk_create(Goal(title=f"Goal {t.pk}.{j}", parent=t)
                                      for t in teams for j in range(99))
    tree.relink_all()  # written in bulk, without Goal.save
    return root, leaves


def _fields(model, obj, skip=()) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in model._meta.concrete_fields
            if not f.primary_key and not f.generated and f.attname not in skip}


def grow_runs(spec, approver, total: int, checkpoints_per_run: int, goals=(),
              waiting_every: int = 100, needle_every: int = 10_000) -> int:
    """`total` runs of the gate spec, one in `waiting_every` waiting at its gate and the rest
    finished, each with `checkpoints_per_run` checkpoints, spread over `goals`; one in
    `needle_every` is titled "needle" (a rare word for the search). Returns the checkpoints
    written. The finished runs' tally changes are written as the engine writes them, and
    folded as the periodic task folds them; so are their day rows."""
    from datetime import UTC

    from goals.rollup import fold_days, fold_tallies
    from workflows import engine
    from workflows.models import Checkpoint, GoalTally, Run, RunDay, RunStatus, Step
    from workflows.workers import worker

    finished = engine.open_run(spec, title="bench template").run
    waiting = engine.open_run(spec, title="bench template").run
    engine.approve(finished, "gate", user=approver)
    while worker.work(budget=30):
        pass
    templates = []
    for run in (finished, waiting):
        run.refresh_from_db()
        steps = list(Step.objects.filter(run=run).order_by("index"))
        marks = list(Checkpoint.objects.filter(run=run).order_by("seq"))
        # Pad the timeline to its size with copies of its transitions, in order.
        marks = list(itertools.islice(itertools.cycle(marks), checkpoints_per_run))
        templates.append((run, steps, marks))
    goal_ids = [g.pk for g in goals] or [None]
    written = 0
    for start in range(0, total, BATCH):
        made = []
        for i in range(start, min(start + BATCH, total)):
            run, steps, marks = templates[1 if i % waiting_every == 0 else 0]
            title = f"needle {i}" if i % needle_every == 1 else f"bench run {i}"
            made.append((Run(**{**_fields(Run, run), "title": title,
                                "goal_id": goal_ids[i % len(goal_ids)],
                                "checkpoint_seq": len(marks)}), steps, marks))
        Run.objects.bulk_create([run for run, _, _ in made], batch_size=500)
        GoalTally.objects.bulk_create(
            (GoalTally(goal_id=run.goal_id, runs_completed=1, steps_total=run.steps_total,
                       steps_done=run.steps_done)
             for run, _, _ in made
             if run.goal_id is not None and run.status == RunStatus.COMPLETED),
            batch_size=1_000)
        RunDay.objects.bulk_create(
            (RunDay(day=run.finished_at.astimezone(UTC).date(), spec_name=run.spec_name,
                    goal_id=run.goal_id, completed=1)
             for run, _, _ in made if run.status == RunStatus.COMPLETED), batch_size=1_000)
        new_steps = [Step(**{**_fields(Step, step, skip=("run_id", "child_run_id")),
                             "run_id": run.pk})
                     for run, steps, _ in made for step in steps]
        Step.objects.bulk_create(new_steps, batch_size=500)
        step_ids = {(s.run_id, s.key): s.pk for s in new_steps}
        keys = {s.pk: s.key for _, steps, _ in made for s in steps}
        Checkpoint.objects.bulk_create(
            (Checkpoint(**{**_fields(Checkpoint, mark, skip=("run_id", "step_id", "seq")),
                           "run_id": run.pk, "seq": seq,
                           "step_id": step_ids.get((run.pk, keys.get(mark.step_id)))})
             for run, _, marks in made for seq, mark in enumerate(marks, 1)),
            batch_size=1_000)
        written += sum(len(marks) for _, _, marks in made)
    fold_tallies()
    fold_days()
    return written


def grow_timeline(spec, count: int):
    """One run waiting at its gate with `count` checkpoints (a long-lived run's page)."""
    from workflows import engine
    from workflows.models import Checkpoint

    run = engine.open_run(spec).run
    Checkpoint.objects.bulk_create(
        (Checkpoint(run=run, seq=run.checkpoint_seq + 1 + i, kind="transition",
                    run_status="waiting_approval", actor_name="bench",
                    summary=f"progress {i}", evidence={"stdout": "x" * 80})
         for i in range(count - run.checkpoint_seq)), batch_size=1_000)
    type(run).objects.filter(pk=run.pk).update(checkpoint_seq=count)
    return run

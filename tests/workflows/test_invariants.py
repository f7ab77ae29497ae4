"""Random operation sequences against the engine, checking its invariants after each."""

from __future__ import annotations

import os

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from workflows import engine
from workflows.engine import rules
from workflows.models import STEP_FRONTIER, Checkpoint, Run, Step
from workflows.specs.storage import store_spec

SPEC = {
    "name": "invariants",
    "steps": [
        {"key": "a", "run": {"command": ["true"]}, "max_retries": 1},
        {"key": "b", "run": {"command": ["true"]}, "continue_on_failure": True},
        {"key": "gate", "depends_on": ["a"], "approval": {"group": "qa", "required": 2}},
        {"key": "c", "depends_on": ["gate", "b"], "run": {"command": ["true"]}},
        {"key": "d", "depends_on": ["a"], "run": {"command": ["true"]},
         "continue_on_failure": True},
        {"key": "e", "depends_on": ["c", "d"], "approval": {"group": "qa"}},
        # Runs only when a completion patched x to 1 (the complete rule patches x, y, z).
        {"key": "f", "depends_on": ["a"], "when": {"state": "x", "equals": 1},
         "run": {"command": ["true"]}},
        # A wait step: only reports move it (and the worker rules refuse it).
        {"key": "w", "depends_on": ["b"]},
    ],
}
KEYS = st.sampled_from(["a", "b", "gate", "c", "d", "e", "f", "w"])
TERMINAL = {"completed", "failed", "cancelled"}


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        from django.contrib.auth.models import Group, User

        qa, _ = Group.objects.get_or_create(name="qa")
        self.users = []
        for name in ("hypo-bob", "hypo-carol", "hypo-dan"):
            user, _ = User.objects.get_or_create(username=name)
            user.groups.add(qa)
            self.users.append(user)
        from django.contrib.auth.models import Permission

        self.users[2].user_permissions.add(Permission.objects.get(codename="add_run"))
        spec = store_spec(SPEC)[0]
        # Runs of earlier examples stay in the database: out of the way of claim_next.
        Run.objects.update(claimable_at=None)
        from goals.models import Goal

        self.goal = Goal.objects.create(title="invariants")
        self.run = engine.open_run(spec, actor=self.users[2], goal=self.goal).run
        self.checkpoints = 1

    def apply(self, operation, retry=False):
        before = Run.objects.get(pk=self.run.pk).status
        try:
            result = operation()
        except engine.WorkflowError:
            result = None
        # One checkpoint per transition, none for a refused one (a step whose condition was
        # false when its dependencies settled gets one of its own, "condition").
        assert self.new_checkpoints() == (1 if result is not None else 0)
        after = Run.objects.get(pk=self.run.pk).status
        if before in TERMINAL and not retry:
            assert after == before, f"terminal run moved {before} -> {after}"

    @rule(key=KEYS)
    def start(self, key):
        self.apply(lambda: engine.start_step(self.run, key, lease_seconds=30, owner="w"))

    @rule(key=KEYS, patch=st.dictionaries(st.sampled_from("xyz"), st.integers(), max_size=2))
    def complete(self, key, patch):
        self.apply(lambda: engine.complete_step(self.run, key, state_patch=patch))

    @rule(key=KEYS, retryable=st.booleans())
    def fail(self, key, retryable):
        self.apply(lambda: engine.fail_step(self.run, key, retryable=retryable))

    @rule(key=KEYS, who=st.integers(0, 2))
    def approve(self, key, who):
        self.apply(lambda: engine.approve(self.run, key, user=self.users[who]))

    @rule(key=KEYS, who=st.integers(0, 2))
    def reject(self, key, who):
        self.apply(lambda: engine.reject(self.run, key, user=self.users[who], comment="no"))

    @rule(key=KEYS)
    def retry(self, key):
        self.apply(lambda: engine.retry_step(self.run, key), retry=True)

    @rule(key=KEYS)
    def skip(self, key):
        # Skipping the failure that holds a failed run back moves it on, as a retry does.
        self.apply(lambda: engine.skip_step(self.run, key, reason="hypothesis"), retry=True)

    @rule(key=KEYS, status=st.sampled_from([None, "running", "completed", "failed", "blocked"]))
    def report(self, key, status):
        self.apply(lambda: engine.record_transition(self.run, key, step_status=status))

    # The worker's moves: claim whatever is next, complete with an offer to go on.
    @rule()
    def claim_next(self):
        self.apply_claim(lambda: engine.claim_next(owner="w", lease_seconds=30))

    @rule(key=KEYS)
    def complete_and_go_on(self, key):
        def move():
            step = Step.objects.get(run=self.run, key=key)
            checkpoint = engine.complete_step(self.run, key, lease_token=step.lease_token,
                                              chain=engine.Chain("w", 30))
            return checkpoint, getattr(checkpoint, "next_step", None)

        before = Run.objects.get(pk=self.run.pk).status
        try:
            _, chained = move()
        except engine.WorkflowError:
            assert self.new_checkpoints() == 0
            return
        assert self.new_checkpoints() == (2 if chained else 1)  # one per transition
        if before in TERMINAL:
            assert Run.objects.get(pk=self.run.pk).status == before

    def apply_claim(self, claim):
        step = claim()
        assert self.new_checkpoints() == (1 if step is not None else 0)

    def new_checkpoints(self) -> int:
        """Checkpoints since the last call, not counting condition skips."""
        new = Checkpoint.objects.filter(run=self.run, seq__gt=self.checkpoints)
        count = new.count()
        skips = new.filter(actor_name="condition").count()
        self.checkpoints += count
        return count - skips

    @rule()
    def due_retries(self):
        self.run.steps.filter(status="retrying").update(retry_after=None)

    @rule()
    def add_step(self):
        self.added = getattr(self, "added", 0) + 1
        self.apply(lambda: engine.add_steps(
            self.run, [{"key": f"added{self.added}", "depends_on": ["a"]}],
            actor=self.users[2])[0])

    @rule()
    def cancel(self):
        self.apply(lambda: engine.cancel_run(self.run))

    @invariant()
    def checkpoint_seq_is_gapless(self):
        seqs = list(Checkpoint.objects.filter(run=self.run).order_by("seq")
                    .values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
        assert Run.objects.get(pk=self.run.pk).checkpoint_seq == len(seqs)

    @invariant()
    def no_step_completed_twice_per_attempt(self):
        done = Checkpoint.objects.filter(
            run=self.run, step_status="completed",
            kind__in=["step_completed", "step_approved", "transition"])
        keys = list(done.values_list("step__key", flat=True))
        retried = set(Checkpoint.objects.filter(run=self.run, kind="step_retried")
                      .values_list("step__key", flat=True))
        for key in set(keys) - retried:
            assert keys.count(key) == 1, f"{key} completed {keys.count(key)} times"

    @invariant()
    def run_status_matches_steps(self):
        run = Run.objects.get(pk=self.run.pk)
        steps = {s.key: s for s in run.steps.all()}
        steps = list(steps.values())
        assert run.status == rules.run_status(
            run, steps, unsettled=not all(rules.settled(s) for s in steps),
            moved=any(s.attempt > 0 or s.status == "skipped" for s in steps))

    @invariant()
    def step_counts_match_steps(self):
        # The goal rollups add these up instead of reading the steps.
        run = Run.objects.get(pk=self.run.pk)
        statuses = list(run.steps.values_list("status", flat=True))
        assert (run.steps_total, run.steps_done) == (
            len(statuses), sum(1 for s in statuses if s in ("completed", "skipped")))

    @rule()
    def fold_tallies(self):
        from goals.rollup import fold_tallies

        fold_tallies()

    @invariant()
    def the_goal_rollup_matches_the_run(self):
        # Finished runs reach it through tallies (folded or not), open ones live.
        from goals.rollup import rollup

        run = Run.objects.get(pk=self.run.pk)
        counted = run.status != "cancelled"
        statuses = list(run.steps.values_list("status", flat=True))
        got = rollup(self.goal.pk)
        assert (got.runs_open, got.runs_completed, got.runs_failed) == (
            int(run.status not in TERMINAL), int(run.status == "completed"),
            int(run.status == "failed"))
        assert (got.steps_total, got.steps_done) == (
            len(statuses) * counted,
            sum(1 for s in statuses if s in ("completed", "skipped")) * counted)

    @invariant()
    def dependency_counts_match_steps(self):
        # Commits read only the frontier; these counters are what keeps that exact.
        steps = {s.key: s for s in Run.objects.get(pk=self.run.pk).steps.all()}
        for step in steps.values():
            unsettled = [d for d in step.depends_on if not rules.settled(steps[d])]
            assert step.waiting_on == len(unsettled), f"{step.key} waits on {unsettled}"
            assert step.dependents == [k for k, s in steps.items() if step.key in s.depends_on]

    @invariant()
    def next_action_matches_steps(self):
        run = Run.objects.get(pk=self.run.pk)
        steps = list(run.steps.order_by("index"))
        ready = engine.ready_steps(run, steps)
        assert (run.current_step, run.next_action) == rules.next_action(
            steps, ready[0] if ready else None)

    @invariant()
    def the_frontier_is_the_same_in_sql_and_python(self):
        steps = list(Step.objects.filter(run=self.run))
        in_sql = set(Step.objects.filter(STEP_FRONTIER, run=self.run).values_list("key",
                                                                                   flat=True))
        assert in_sql == {s.key for s in steps if rules.in_frontier(s)}

    @invariant()
    def the_claim_time_matches_the_steps(self):
        run = Run.objects.get(pk=self.run.pk)
        steps = list(run.steps.order_by("index"))
        now = timezone.now()
        ready = [s for s in steps if rules.is_ready(s, now)]
        held = rules.hard_failure(steps) is not None
        running = sum(1 for s in steps if s.status == "running" and s.kind == "run")
        frontier = [s for s in steps if rules.in_frontier(s)]
        expected = rules.claimable_at(run, frontier, ready[0] if ready else None,
                                      held_back=held, running=running, now=now)
        if expected is None:
            assert run.claimable_at is None
        elif expected == now:
            assert run.claimable_at is not None and run.claimable_at <= now
        else:
            assert run.claimable_at == expected
        if not (run.is_terminal or held):
            # Every ready worker step is announced: its run is claimable and was rung for.
            assert all(s.rung_at for s in steps if s.kind == "run" and s.status == "pending"
                       and s.waiting_on == 0)

    @invariant()
    def gates_open_once_their_dependencies_settle(self):
        run = Run.objects.get(pk=self.run.pk)
        steps = {s.key: s for s in run.steps.all()}
        if run.is_terminal or any(s.status == "failed" and not s.continue_on_failure
                                  for s in steps.values()):
            return
        for step in steps.values():
            if step.kind == "approval" and all(rules.settled(steps[d]) for d in step.depends_on):
                assert step.status != "pending", f"{step.key} should be waiting for approval"


@pytest.mark.django_db
def test_engine_invariants_hold_under_random_operations():
    run_state_machine_as_test(
        EngineMachine,
        settings=settings(max_examples=int(os.environ.get("TOLLGATE_HYPOTHESIS_EXAMPLES", "40")),
                          stateful_step_count=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow],
                          # CI must be repeatable and bounded: no random seed, no long shrink.
                          derandomize=bool(os.environ.get("CI")),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate]
                          if os.environ.get("CI") else list(Phase)),
    )

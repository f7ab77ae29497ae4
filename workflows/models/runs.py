"""Runs, their steps, approvals, compensations and the append-only checkpoint log.

Statuses change only through `workflows.engine`; these models hold the invariants the
database can check."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Coalesce, Concat, Lower, Now
from django.utils import timezone

from goals.models import Priority

from .specs import WorkflowSpec


class RunStatus(models.TextChoices):
    OPEN = "open"
    RUNNING = "running"
    BLOCKED = "blocked"
    WAITING_APPROVAL = "waiting_approval"
    FAILED = "failed"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


OPEN_RUN_STATUSES = (
    RunStatus.OPEN,
    RunStatus.RUNNING,
    RunStatus.BLOCKED,
    RunStatus.WAITING_APPROVAL,
)


TERMINAL_RUN_STATUSES = (RunStatus.FAILED, RunStatus.COMPLETED, RunStatus.CANCELLED)


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    RETRYING = "retrying"
    BLOCKED = "blocked"
    FAILED = "failed"
    COMPLETED = "completed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    # Completed, then undone by its compensation when the run failed: not done any more, so a
    # retry of the run runs it again.
    COMPENSATED = "compensated"


# Steps under way: started, or waiting on people. With pending ones, the open steps.
UNDER_WAY_STEP_STATUSES = (
    StepStatus.RUNNING,
    StepStatus.RETRYING,
    StepStatus.WAITING_APPROVAL,
    StepStatus.BLOCKED,
)


OPEN_STEP_STATUSES = (StepStatus.PENDING, *UNDER_WAY_STEP_STATUSES)


# What progress counts as done (a run's steps_done, the goal rollups).
DONE_STEP_STATUSES = (StepStatus.COMPLETED, StepStatus.SKIPPED)


class StepKind(models.TextChoices):
    RUN = "run"
    APPROVAL = "approval"
    WAIT = "wait", "waits for a report"  # never claimed by a worker


class Run(models.Model):
    spec = models.ForeignKey(WorkflowSpec, on_delete=models.PROTECT, related_name="runs")
    # Denormalised so the database can enforce one open run per spec name and key.
    # Looked up by the (spec_name, created_at) and (goal, status) indexes: an index of
    # their own would be one more write on every run's insert and move (see Meta).
    spec_name = models.SlugField(max_length=100, editable=False, db_index=False)
    goal = models.ForeignKey(
        "goals.Goal", null=True, blank=True, on_delete=models.PROTECT, related_name="runs",
        db_index=False,
    )
    title = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus, default=RunStatus.OPEN)
    priority = models.CharField(max_length=16, choices=Priority, default=Priority.NORMAL)
    # Workers claim the claimable runs by rank, then the one that has waited longest.
    priority_rank = models.GeneratedField(
        expression=models.Case(*(models.When(priority=p, then=rank)
                                 for rank, p in enumerate(Priority.values)),
                               default=1),
        output_field=models.SmallIntegerField(), db_persist=True)
    # At most this many of the run's worker steps run at once (the spec's max_parallel).
    max_parallel = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # When a worker may next claim one of its steps (None: nothing waits for a worker), and
    # when a worker last did: kept by the engine, they order the claims (rules.claimable_at).
    claimable_at = models.DateTimeField(null=True, blank=True, editable=False)
    served_at = models.DateTimeField(default=timezone.now, editable=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requested_runs",
    )
    idempotency_key = models.CharField(max_length=200, blank=True)
    # Who opened it, when someone opened it for the requester (an operator's "for bob"):
    # the requester is whom four-eyes keeps from deciding it.
    opened_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="runs_opened_for_others",
                                  db_index=False)  # indexed where set (Meta)
    # The label of the run's latest labelled checkpoint (where an agent says it stands).
    last_label = models.CharField(max_length=100, blank=True, default="", db_default="")
    shared_state = models.JSONField(default=dict, blank=True)
    # The spec's typed run parameters, as validated when the run started.
    params = models.JSONField(default=dict, blank=True)
    # The schedule that opened it: a slot's run, or a retry of a slot (indexed where set).
    schedule = models.ForeignKey("workflows.Schedule", null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="runs",
                                 db_index=False, editable=False)
    next_action = models.CharField(max_length=500, blank=True)
    current_step = models.CharField(max_length=100, blank=True)
    error = models.TextField(blank=True)
    # What callers say of a run: its kind ("release", "agent-task"), an outside reference
    # they find it by again (a ticket or session id), why it is blocked.
    kind = models.CharField(max_length=50, blank=True, db_default="", default="")
    # The next action as a caller said it (POST /api/runs, /transition); it stands over the
    # engine's derived `next_action` until the caller changes it or the run ends.
    caller_next_action = models.CharField(max_length=500, blank=True, db_default="",
                                          default="")
    ref = models.CharField(max_length=200, blank=True, db_default="", default="")
    blocker_reason = models.CharField(max_length=500, blank=True, db_default="", default="")
    # The shared-state keys that gates' approvers wrote, space-separated: reserved from the
    # first decision on, so no later patch rewrites what an approver chose.
    decided_keys = models.TextField(blank=True, db_default="", default="", editable=False)
    # A run inside a run: the step of the parent run that opened it and waits for it.
    parent_step = models.ForeignKey("Step", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="child_runs", editable=False,
                                    db_index=False)  # indexed where set (Meta)
    checkpoint_seq = models.PositiveIntegerField(default=0, editable=False)
    # The hash of its last checkpoint (workflows.audit): a checkpoint cut off the end of the
    # chain is found by it.
    chain_head = models.CharField(max_length=64, blank=True, db_default="", default="",
                                  editable=False)
    # Kept by the transaction that changes a step, so a goal's rollup adds up its runs rather
    # than reading every step under it.
    steps_total = models.PositiveIntegerField(default=0, editable=False)
    steps_done = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # What the run search matches, lower-cased in one column: on PostgreSQL a trigram index
    # (migration 0027) serves "contains" from it instead of a scan of every run.
    search_text = models.GeneratedField(
        expression=Lower(Concat("title", models.Value(" "), "idempotency_key",
                                models.Value(" "), "ref", models.Value(" "), "spec_name",
                                output_field=models.TextField())),
        output_field=models.TextField(), db_persist=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("operate_run", "Can retry, skip, cancel and recover runs"),
                       ("open_run_for_others", "Can open runs on someone else's behalf")]
        indexes = [
            models.Index(fields=["status", "-created_at"]),
            # The runs page and GET /api/runs, newest first: read in order, not sorted.
            models.Index(fields=["-created_at", "-id"], name="run_newest_first_idx"),
            models.Index(fields=["goal", "status"]),
            models.Index(fields=["spec_name", "-created_at"]),
            models.Index(fields=["ref"], condition=~Q(ref=""), name="run_ref_idx"),
            # The progress report reads the runs of its weeks' edge days exactly (RunDay).
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False),
                         name="run_finished_at_idx"),
            # The claim order of the runs that have work for a worker (engine.claim_next).
            models.Index(fields=["-priority_rank", "served_at"],
                         condition=Q(claimable_at__isnull=False), name="run_claim_order_idx"),
            # Foreign keys that most runs leave empty, indexed only where set: a run's
            # every move writes no entry for them (PostgreSQL's updates here are not HOT).
            models.Index(fields=["parent_step"], condition=Q(parent_step__isnull=False),
                         name="run_parent_step_idx"),
            models.Index(fields=["schedule", "-created_at"], condition=Q(schedule__isnull=False),
                         name="run_schedule_idx"),
            models.Index(fields=["opened_by"], condition=Q(opened_by__isnull=False),
                         name="run_opened_by_idx"),
        ]
        constraints = [
            # One key, one open run, in a key's scope (its caller, spec and goal): the rule
            # open_run keeps, held by the database when two starts race (no caller or no
            # goal is one scope of its own, hence the coalesce).
            models.UniqueConstraint(
                Coalesce("requested_by", Value(0)), "spec_name", Coalesce("goal", Value(0)),
                "idempotency_key",
                condition=Q(status__in=OPEN_RUN_STATUSES) & ~Q(idempotency_key=""),
                name="run_one_open_per_key_in_scope",
            ),
            models.CheckConstraint(condition=Q(steps_done__lte=models.F("steps_total")),
                                   name="run_steps_done_within_total"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title or self.spec_name}"

    def get_absolute_url(self) -> str:
        from django.urls import reverse

        return reverse("run_detail", args=[self.pk])

    @property
    def what_next(self) -> str:
        """The next action: the caller's words if given, else the engine's."""
        return self.caller_next_action or self.next_action

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def duration_seconds(self) -> float:
        """From opening to its end, or to now while it is open."""
        return ((self.finished_at or timezone.now()) - self.created_at).total_seconds()


# What decides a run's status and next move: open steps, hard failures, gates whose
# dependencies are settled, and ready worker steps not rung yet. The rest of the run is
# settled, waits on these, or is ready and already rung. The engine reads only these rows.
STEP_FRONTIER = (
    Q(status__in=UNDER_WAY_STEP_STATUSES)
    | Q(status=StepStatus.FAILED, continue_on_failure=False)
    | Q(status=StepStatus.PENDING, waiting_on=0)
    & (Q(kind=StepKind.APPROVAL) | Q(rung_at__isnull=True))
)


class GoalTally(models.Model):
    """What a goal's finished runs add to its rollup, as changes: the transaction that
    finishes a run under the goal, reopens it, or moves its counts while it is finished adds
    a row; the periodic task fold_goal_tallies folds them into one row per goal. So a rollup
    reads a row per goal and the runs still open, never every finished run (and a pruned
    run's counts stay)."""

    goal = models.ForeignKey("goals.Goal", on_delete=models.CASCADE, related_name="+")
    runs_completed = models.IntegerField(default=0)
    runs_failed = models.IntegerField(default=0)
    steps_total = models.BigIntegerField(default=0)
    steps_done = models.BigIntegerField(default=0)
    folded = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["goal"], condition=Q(folded=True),
                                    name="goal_tally_one_folded_per_goal"),
        ]

    def __str__(self) -> str:
        return f"goal {self.goal_id} {'tally' if self.folded else 'change'}"


class RunDay(models.Model):
    """Runs finished per UTC day, spec and goal (none for a run without one), for the
    progress report: kept as GoalTally is, a change row from the transaction that finishes a
    run or reopens a finished one, folded by fold_goal_tallies into one row per day, spec and
    goal. So the report's weeks and failure rates read a row per day and spec, never every
    finished run."""

    day = models.DateField()
    spec_name = models.SlugField(max_length=100)
    goal = models.ForeignKey("goals.Goal", null=True, blank=True, on_delete=models.CASCADE,
                             related_name="+")
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    folded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["goal", "day"]), models.Index(fields=["day"])]
        constraints = [
            models.UniqueConstraint(fields=["day", "spec_name", "goal"],
                                    condition=Q(folded=True, goal__isnull=False),
                                    name="run_day_one_folded"),
            models.UniqueConstraint(fields=["day", "spec_name"],
                                    condition=Q(folded=True, goal__isnull=True),
                                    name="run_day_one_folded_without_goal"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.spec_name} {'tally' if self.folded else 'change'}"


class HeldByProcess(models.Model):
    """Who holds a leased attempt: the consumer process (host, boot, pid, start time). The
    sweeper reclaims a lease only once that holder is gone."""

    holder_host = models.CharField(max_length=200, blank=True)
    holder_boot_id = models.CharField(max_length=36, blank=True)
    # The holder's pid namespace: pids (and the holder's liveness) mean something only there.
    holder_pidns = models.CharField(max_length=40, blank=True)
    holder_pid = models.PositiveIntegerField(null=True, blank=True)
    holder_started = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        abstract = True


class Step(HeldByProcess):
    # No index of its own: the (run, key) unique constraint leads with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    key = models.CharField(max_length=100)
    title = models.CharField(max_length=200, blank=True)
    index = models.PositiveIntegerField()
    depends_on = models.JSONField(default=list, blank=True)
    # The reverse edges and a count of unsettled dependencies, kept by the engine, so a
    # transition touches only the steps it changes instead of re-reading the whole run.
    dependents = models.JSONField(default=list, blank=True)
    waiting_on = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=StepKind)
    config = models.JSONField(default=dict, blank=True, help_text="The step as the spec has it.")
    status = models.CharField(max_length=20, choices=StepStatus, default=StepStatus.PENDING)
    continue_on_failure = models.BooleanField(default=False)
    attempt = models.PositiveIntegerField(default=0)
    # A manual retry opens a fresh window of max_retries automatic retries from here.
    attempt_base = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveIntegerField(default=0)
    retry_backoff_seconds = models.FloatField(default=0)
    retry_after = models.DateTimeField(null=True, blank=True)
    approval_group = models.CharField(max_length=150, blank=True)
    approval_required = models.PositiveIntegerField(default=1)
    allow_self_approval = models.BooleanField(default=False)
    waiting_since = models.DateTimeField(null=True, blank=True)
    # When a waiting gate times out (its spec's timeout_seconds); cleared once it is decided.
    deadline_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # When a waiting gate's approvers are next reminded (see engine.gates.remind_gate).
    remind_at = models.DateTimeField(null=True, blank=True)
    reminders_sent = models.PositiveIntegerField(default=0)
    # A waiting gate's evidence as its approvers see it (params, shared state, spec), as a
    # digest (moves.evidence_digest): when it changes, earlier approvals no longer count.
    evidence_digest = models.CharField(max_length=64, blank=True, default="", db_default="")
    compensation = models.JSONField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    # When the queue was last rung for this step; the sweeper re-rings what looks lost.
    rung_at = models.DateTimeField(null=True, blank=True)
    compensated_at = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The lease token of the attempt whose own report ended it: the same report sent again
    # (its connection dropped as it committed) is recognised, not recorded twice.
    finished_token = models.CharField(max_length=64, blank=True)
    # The command the running attempt spawned (its holder is in HeldByProcess).
    # The run this step opened and waits for (a `workflow` step's current attempt).
    child_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+", editable=False,
                                  db_index=False)  # indexed where set (Meta)
    child_pid = models.PositiveIntegerField(null=True, blank=True)
    child_pgid = models.PositiveIntegerField(null=True, blank=True)
    # When the attempt's work began, written before it begins: at the claim, or, for a step
    # claimed in a batch behind others, when its turn came. Null only while such a step
    # waits its turn: a lease that runs out then was never begun, whoever held it, and is
    # given back unspent. Never null otherwise (a new row takes its creation time), so a
    # claim made by a release from before this column (an upgrade under way), which leaves
    # it as it was, counts as begun, as it was judged then.
    began_at = models.DateTimeField(null=True, blank=True, default=timezone.now,
                                    db_default=Now())
    # When the sweeper found the lease overdue with its holder alive (noted once an attempt).
    overdue_noted_at = models.DateTimeField(null=True, blank=True)
    # Who added the step while the run ran (empty for the spec's own steps).
    added_by = models.CharField(max_length=200, blank=True)
    # Who reported the step's last summary and evidence through /transition (a wait step's
    # reporter: pages show its words as theirs, never as a worker's).
    reported_by = models.CharField(max_length=200, blank=True)
    last_summary = models.TextField(blank=True)
    last_evidence = models.JSONField(default=dict, blank=True)
    last_state_patch = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="step_key_unique_in_run"),
            models.CheckConstraint(
                condition=Q(approval_required__gte=1), name="step_quorum_at_least_one"
            ),
        ]
        indexes = [
            # The sweeper's scan: only live leases, ordered by expiry.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="running", lease_expires_at__isnull=False),
                name="step_running_lease_idx",
            ),
            # Inbox and dispatch scans touch only open steps.
            models.Index(
                fields=["approval_group", "waiting_since"],
                condition=Q(status="waiting_approval"),
                name="step_waiting_gate_idx",
            ),
            models.Index(
                fields=["deadline_at"],
                condition=Q(status="waiting_approval", deadline_at__isnull=False),
                name="step_gate_deadline_idx",
            ),
            models.Index(
                fields=["remind_at"],
                condition=Q(status="waiting_approval", remind_at__isnull=False),
                name="step_gate_reminder_idx",
            ),
            models.Index(
                fields=["deadline_at"],
                condition=Q(kind="wait", deadline_at__isnull=False),
                name="step_wait_deadline_idx",
            ),
            # A run's frontier without reading its other steps, already in step order.
            models.Index(fields=["run", "index"], condition=STEP_FRONTIER,
                         name="step_frontier_idx"),
            # A run's ready worker steps in order: what a claim takes next.
            models.Index(fields=["run", "index"],
                         condition=Q(kind="run", status="pending", waiting_on=0),
                         name="step_ready_idx"),
            # Retries that fall due (the sweeper's check for runs left unscheduled).
            models.Index(fields=["run", "index"],
                         condition=Q(kind="run", status="retrying"),
                         name="step_retrying_idx"),
            # The run a workflow step opened, where it opened one (see Run's parent_step).
            models.Index(fields=["child_run"], condition=Q(child_run__isnull=False),
                         name="step_child_run_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.key}"

    @property
    def account(self) -> dict | None:
        """The account its command or agent runs under ({"profile", "tool"?}), if named."""
        run = self.config.get("run") or {}
        return run.get("account") or (run.get("agent") or {}).get("account")

    @property
    def duration(self):
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None

    @property
    def duration_seconds(self) -> float | None:
        """Its current attempt's, from its start (a gate: since it began waiting) to its end
        or to now (None: not started)."""
        began = self.started_at or self.waiting_since
        if began is None:
            return None
        return ((self.finished_at or timezone.now()) - began).total_seconds()


class CompensationStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Compensation(HeldByProcess):
    """Undoing one completed step of a failed run: durable work under a lease, like a step.

    Rows are written in the transaction that fails the run, so a compensation cannot be lost
    with a queue message; the sweeper recovers one whose worker died. A compensation may run
    again after a worker was killed in the middle of it, so it must be safe to repeat.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="compensations")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="compensations")
    order = models.PositiveIntegerField(help_text="Latest completed step first.")
    status = models.CharField(max_length=16, choices=CompensationStatus,
                              default=CompensationStatus.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    rung_at = models.DateTimeField(null=True, blank=True)
    summary = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "order"]
        indexes = [models.Index(fields=["status", "lease_expires_at"],
                                condition=Q(status__in=["pending", "running"]),
                                name="compensation_open_idx")]

    def __str__(self) -> str:
        return f"undo {self.step} ({self.status})"


class Decision(models.TextChoices):
    APPROVE = "approve", "approved"
    REJECT = "reject", "rejected"


class Channel(models.TextChoices):
    """Where a decision was made: the audit says how each one came in."""

    WEB = "web", "inbox card"
    RUN_PAGE = "run_page", "run page"
    BULK = "bulk", "bulk decision"
    MAIL_LINK = "mail_link", "mailed link"
    API = "api", "API"
    CHAT = "chat", "chat"
    MAIL_REPLY = "mail_reply", "mail reply"
    PUSH = "push", "push notification"


class ApprovalQuerySet(models.QuerySet):
    def delete(self):
        raise TypeError("Decisions are never deleted: they are the audit trail.")


class Approval(models.Model):
    # PROTECT, as for checkpoints: a recorded decision outlives any attempt to delete its gate.
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="approvals")
    attempt = models.PositiveIntegerField()
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approvals"
    )
    decision = models.CharField(max_length=16, choices=Decision)
    comment = models.TextField(blank=True)
    # What the approver filled in on the gate's form (approval.form in the spec).
    values = models.JSONField(default=dict, blank=True)
    # The group the gate waited on, and for how long, when this decision was made.
    group = models.CharField(max_length=150, blank=True)
    waited_seconds = models.FloatField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)
    # How it was made; from chat, by which chat account ("slack:T1/U2 @ann"); from a mail
    # reply, which message (its Message-ID).
    channel = models.CharField(max_length=16, choices=Channel, default=Channel.WEB,
                               db_default=Channel.WEB)
    chat_identity = models.CharField(max_length=200, blank=True, default="", db_default="")
    # A delegate's decision is made for the person away (see Preference.delegate): they are
    # the one it counts as, and neither decides this attempt again.
    on_behalf_of = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="+")
    # The approval rule this decision counted toward.
    rule = models.ForeignKey("workflows.GateRule", null=True, blank=True,
                             on_delete=models.PROTECT, related_name="decisions")
    # A signed decision (approval.signature): what signing meant, how the person proved who
    # they were at that moment, their full name then, and the digest of what they signed.
    signature_meaning = models.CharField(max_length=200, blank=True, default="", db_default="")
    signature_method = models.CharField(max_length=20, blank=True, default="", db_default="")
    signer_name = models.CharField(max_length=300, blank=True, default="", db_default="")
    signature_digest = models.CharField(max_length=64, blank=True, default="", db_default="")
    # The digest of the gate's evidence this decision was made on (Step.evidence_digest).
    evidence_digest = models.CharField(max_length=64, blank=True, default="", db_default="")

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["group", "at"]), models.Index(fields=["at"])]
        permissions = [("export_audit", "Can export every decision (the audit page)")]
        constraints = [
            models.UniqueConstraint(
                fields=["step", "attempt", "user"], name="approval_one_per_user_attempt"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.decision} {self.step}"

    def delete(self, *args, **kwargs):
        raise TypeError("Decisions are never deleted: they are the audit trail.")

    @property
    def channel_label(self) -> str:
        """Where it was decided, as pages and messages say it: "Slack (@bob)" for a chat
        decision (the audit keeps the account's full label), else the channel's name."""
        if self.channel == Channel.CHAT and self.chat_identity:
            provider, _, account = self.chat_identity.partition(":")
            name = account.partition(" ")[2]
            return f"{provider.capitalize()} ({name})" if name else provider.capitalize()
        return self.get_channel_display()

    @property
    def signature_line(self) -> str:
        """A signed decision as mail and chat show it (Part 11's manifestation): meaning,
        name, username, time with its zone and method; "" if it was not signed."""
        if not self.signature_meaning:
            return ""
        return (f"signed “{self.signature_meaning}” as {self.signer_name} "
                f"({self.user.get_username()}) at {self.at:%Y-%m-%d %H:%M:%S %Z} by "
                f"{self.signature_method}")


class CheckpointKind(models.TextChoices):
    RUN_OPENED = "run_opened"
    RUN_CANCELLED = "run_cancelled"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_RETRYING = "step_retrying"
    STEP_FAILED = "step_failed"
    STEP_RETRIED = "step_retried"
    STEP_SKIPPED = "step_skipped"
    STEP_ADDED = "step_added", "step added at run time"
    WAIT_TIMED_OUT = "wait_timed_out"
    STALE_RESULT = "stale_result"
    TRANSITION = "transition", "reported by an agent"
    APPROVAL_RECORDED = "approval_recorded"
    REJECTION_RECORDED = "rejection_recorded"
    STEP_APPROVED = "step_approved"
    STEP_REJECTED = "step_rejected"
    GATE_ESCALATED = "gate_escalated"
    GATE_TIMED_OUT = "gate_timed_out"
    GATE_REMINDED = "gate_reminded"
    GATE_REASSIGNED = "gate_reassigned"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    LEASE_OVERDUE = "lease_overdue", "lease overdue, holder alive"
    LEASE_RECOVERED = "lease_recovered"
    STEP_RELEASED = "step_released", "given back unstarted (no attempt spent)"
    SWEEP_FAILED = "sweep_failed"
    CHILD_STARTED = "child_started", "child run opened"
    CHILD_ENDED = "child_ended", "child run ended"
    RUN_NOTE = "run_note", "note on the run"


class CheckpointQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise TypeError("Checkpoints are append-only.")

    def delete(self):
        raise TypeError("Checkpoints are append-only.")


class Checkpoint(models.Model):
    # PROTECT: the audit trail outlives any attempt to delete its run or steps. No index of
    # its own: the (run, seq) unique constraint leads with run.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="checkpoints",
                            db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40, choices=CheckpointKind)
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.PROTECT, related_name="checkpoints"
    )
    run_status = models.CharField(max_length=20, choices=RunStatus)
    step_status = models.CharField(max_length=20, choices=StepStatus, blank=True)
    # Indexed only where a person acted (see Meta): workers' checkpoints skip the index.
    # Protected: a person who ever acted stays in the record (deactivate them instead).
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        db_index=False,
    )
    actor_name = models.CharField(max_length=200)
    # A caller's name for this point of the run ("tests green", "draft sent").
    label = models.CharField(max_length=100, blank=True, db_default="", default="")
    summary = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    state_patch = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)
    # The audit chain (workflows.audit.chain): the hash of the run's checkpoint before this
    # one ("" for its first), and this one's, over its fields and that.
    prev_hash = models.CharField(max_length=64, blank=True, db_default="", default="")
    hash = models.CharField(max_length=64, blank=True, db_default="", default="")

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="checkpoint_seq_unique_in_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="checkpoint_seq_positive"),
        ]
        indexes = [models.Index(fields=["actor"], condition=Q(actor__isnull=False),
                                name="checkpoint_actor_idx")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise TypeError("Checkpoints are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise TypeError("Checkpoints are append-only.")

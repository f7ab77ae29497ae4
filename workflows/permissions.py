"""Who may do what. The engine enforces these rules; pages, the API and mail only ask them.

The gate rule is written once here in two forms that must agree (a test pins it): a
predicate for one user and gate (`decide_refusal`), and querysets for the inbox
(`decidable_by`) and for the people a notification goes to (`deciders`).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q, QuerySet

from .models import OPEN_RUN_STATUSES, Approval, Run, RunStatus, Step, StepStatus

OPERATE = "workflows.operate_run"
START = "workflows.add_run"
LOAD_SPECS = "workflows.add_workflowspec"
# Specs that run programs on the workers (`command` or `shell`) need a permission of their own.
AUTHOR_COMMANDS = "workflows.author_command_spec"


def is_person(actor) -> bool:
    """An actor that is a user account, as opposed to the system (None or a name)."""
    return actor is not None and not isinstance(actor, str)


def has(user, perm: str) -> bool:
    return bool(user is not None and user.is_authenticated and user.has_perm(perm))


def can_operate(user) -> bool:
    """Retry, skip, cancel and recover need the operator permission."""
    return has(user, OPERATE)


def group_names(user) -> set[str]:
    if not hasattr(user, "_tollgate_groups"):
        user._tollgate_groups = set(user.groups.values_list("name", flat=True))
    return user._tollgate_groups


def decide_refusal(user, run, step, *, groups: set[str] | None = None) -> str | None:
    """Why this user may not decide this gate now, or None when they may.

    `groups` are the user's group names when the caller has just read them (the engine
    does, under the run lock). Whether they already decided this attempt is the engine's
    to check under the lock too.
    """
    name = user.get_username() if is_person(user) else "anonymous"
    if not is_person(user) or not user.is_authenticated or not user.is_active:
        return "Only a signed-in member of the approver group may decide a gate."
    if step.status != StepStatus.WAITING_APPROVAL or run.status not in OPEN_RUN_STATUSES:
        return f"{step.key} is not waiting for approval."
    if step.approval_group not in (group_names(user) if groups is None else groups):
        return (f"{name} is not in the {step.approval_group!r} group, which decides "
                f"{step.key}.")
    if run.requested_by_id == user.pk and not step.allow_self_approval:
        return f"{name} requested run {run.pk} and cannot decide its gate {step.key}."
    return None


def can_decide(user, run, step, decided_step_ids: set[int]) -> bool:
    """True when this user may approve or reject this gate now (the buttons)."""
    return decide_refusal(user, run, step) is None and step.pk not in decided_step_ids


def decidable_by(user) -> QuerySet[Step]:
    """Gates this user may decide now: their group, not yet decided by them, not self-barred."""
    if not (is_person(user) and user.is_authenticated and user.is_active):
        return Step.objects.none()
    decided = Approval.objects.filter(step=OuterRef("pk"), attempt=OuterRef("attempt"),
                                      user=user)
    return (
        Step.objects.filter(status=StepStatus.WAITING_APPROVAL,
                            approval_group__in=user.groups.values("name"),
                            run__status__in=OPEN_RUN_STATUSES)
        .exclude(Q(run__requested_by=user) & Q(allow_self_approval=False))
        .exclude(Exists(decided))
        .order_by("waiting_since", "pk")
    )


def deciders(run, step) -> QuerySet:
    """The people who may decide this gate now and have not yet (a notification's audience)."""
    users = get_user_model().objects.filter(is_active=True, groups__name=step.approval_group)
    if step.status != StepStatus.WAITING_APPROVAL or run.status not in OPEN_RUN_STATUSES:
        return users.none()
    if not step.allow_self_approval and run.requested_by_id:
        users = users.exclude(pk=run.requested_by_id)
    return users.exclude(pk__in=Approval.objects.filter(
        step=step, attempt=step.attempt).values("user_id")).distinct()


def can_work_on(user, run) -> bool:
    """Report progress on a run, or add steps to it: its requester or an operator."""
    return is_person(user) and (run.requested_by_id == user.pk or can_operate(user))


def can_retry(user, run, step) -> bool:
    return step.status == StepStatus.FAILED and run.status != RunStatus.CANCELLED and (
        can_operate(user))


def can_skip(user, run, step) -> bool:
    """Work steps only: a gate is never skipped. A running one is stopped and skipped; a
    failed step may be skipped in a failed run (the run then moves on)."""
    run_allows = run.status in OPEN_RUN_STATUSES or (
        run.status == RunStatus.FAILED and step.status == StepStatus.FAILED)
    return (step.kind != "approval" and run_allows and can_operate(user)
            and step.status in (StepStatus.PENDING, StepStatus.FAILED, StepStatus.BLOCKED,
                                StepStatus.RETRYING, StepStatus.RUNNING))


def can_cancel(user, run) -> bool:
    return run.status in OPEN_RUN_STATUSES and can_operate(user)


def runs_programs(definition: dict) -> bool:
    """Does this spec run programs on the workers: commands, shell or coding agents (in
    steps or compensations)?"""
    for item in definition.get("steps", []):
        for block in (item.get("run") or {}, item.get("compensation") or {}):
            if isinstance(block, dict) and {"command", "shell", "agent"} & set(block):
                return True
    return False


def sees_every_run(user) -> bool:
    """Under TOLLGATE_RUN_VISIBILITY "all" (the default) everyone signed in reads every run;
    under "involved" only operators, auditors and superusers do."""
    from django.conf import settings

    if settings.TOLLGATE_RUN_VISIBILITY == "all":
        return is_person(user) and user.is_authenticated
    return is_person(user) and user.is_authenticated and (
        user.is_superuser or has(user, OPERATE) or has(user, "workflows.export_audit"))


def readable_runs(user, runs: QuerySet | None = None) -> QuerySet:
    """The runs this user may read (pages, outputs, params, state, audit, the API): all of
    them, or under "involved" those they requested or that have a gate for their group."""
    runs = Run.objects.all() if runs is None else runs
    if sees_every_run(user):
        return runs
    if not (is_person(user) and user.is_authenticated):
        return runs.none()
    gated = Step.objects.filter(kind="approval", approval_group__in=user.groups.values("name"))
    return runs.filter(Q(requested_by=user) | Q(pk__in=gated.values("run_id")))


def can_change_specs(user) -> bool:
    """Change specs, and so read their inline env values in clear."""
    return has(user, "workflows.change_workflowspec")


def can_export_audit(user) -> bool:
    """Staff and managers (workflows.export_audit) may export every decision."""
    return bool(user.is_authenticated and (user.is_staff or user.has_perm(
        "workflows.export_audit")))

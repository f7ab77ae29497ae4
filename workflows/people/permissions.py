"""Who may do what. The engine enforces these rules; pages, the API and mail only ask them.

The gate rule is written once here in two forms that must agree (a test pins it): a
predicate for one user and gate (`choose_rule`, which `decide_refusal`, `decision_as` and
the engine ask), and querysets for the inbox (`decidable_by`) and for the people a
notification goes to (`deciders`). A gate waits on the open rules of its attempt (`GateRule`, see
`engine.policy`); a person decides as themselves or for someone away who named them their
delegate, and counts once either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    GateRule,
    Preference,
    Run,
    RunStatus,
    SsoIdentity,
    Step,
    StepStatus,
)
from workflows.timing import clock

OPERATE = "workflows.operate_run"
START = "workflows.add_run"
OPEN_FOR_OTHERS = "workflows.open_run_for_others"
LOAD_SPECS = "workflows.add_workflowspec"
# Specs that run programs on the workers (`command` or `shell`) need a permission of their own.
AUTHOR_COMMANDS = "workflows.author_command_spec"


def is_person(actor) -> bool:
    """An actor that is a user account, as opposed to the system (None or a name)."""
    return actor is not None and not isinstance(actor, str)


def signed_in(user) -> bool:
    """A signed-in, active person: the only kind of actor that may decide a gate."""
    return is_person(user) and user.is_authenticated and user.is_active


NOT_SIGNED_IN = "Only a signed-in member of the approver group may decide a gate."


def vouched_for(user) -> bool:
    """Doors that do not sign in (API tokens, chat) follow sign-on
    (TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS): a person with a sign-on identity the provider has
    not vouched for within that time (no sign-in, no session check: disabled or removed
    there) acts through them no more until they sign in again."""
    limit = settings.TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS
    if not (limit and settings.TOLLGATE_OIDC_ISSUER):
        return True
    last = (SsoIdentity.objects.filter(user=user, issuer=settings.TOLLGATE_OIDC_ISSUER)
            .order_by("-last_sign_in").values_list("last_sign_in", flat=True).first())
    return last is None or timezone.now() - last <= timedelta(seconds=limit)


NOT_VOUCHED_FOR = ("Your company sign-on has not vouched for you lately (disabled or removed "
                   "there?): nothing was recorded. Sign in to Tollgate, then press again.")


def has(user, perm: str) -> bool:
    return bool(user is not None and user.is_authenticated and user.has_perm(perm))


def can_operate(user) -> bool:
    """Retry, skip, cancel and recover need the operator permission."""
    return has(user, OPERATE)


def group_names(user) -> set[str]:
    if not hasattr(user, "_tollgate_groups"):
        user._tollgate_groups = set(user.groups.values_list("name", flat=True))
    return user._tollgate_groups


@dataclass(frozen=True)
class Principal:
    """Someone a person decides as: themselves, or a person away whose delegate they are."""

    pk: int
    name: str
    groups: frozenset[str]
    delegated: bool = False
    away_until: object = None  # when a person away is back (a delegator's)


def delegators(user, now=None) -> list[Principal]:
    """The people whose gates this user decides now (their away period holds and they named
    this user their delegate), with their groups: one query."""
    now = now or clock.now()
    found: dict[int, tuple[str, set, object]] = {}
    for pk, name, group, until in (get_user_model().objects.filter(
            is_active=True, tollgate_preference__delegate=user,
            tollgate_preference__away_from__lte=now, tollgate_preference__away_until__gt=now)
            .values_list("pk", get_user_model().USERNAME_FIELD, "groups__name",
                         "tollgate_preference__away_until")):
        found.setdefault(pk, (name, set(), until))[1].add(group)
    return [Principal(pk, name, frozenset(g for g in groups if g), delegated=True,
                      away_until=until)
            for pk, (name, groups, until) in sorted(found.items())]


def principals(user, *, groups: set[str] | None = None, fresh: bool = False
               ) -> list[Principal]:
    """Whom `user` decides as: themselves, then each person who delegated to them now.
    `fresh` reads again what a page may have cached on the user (the engine does)."""
    own = Principal(user.pk, user.get_username(),
                    frozenset(group_names(user) if groups is None else groups))
    return [own, *acting_for(user, fresh=fresh)]


def remember(user, groups: frozenset[str], delegators: list[Principal]) -> None:
    """Keep what was read of the user's groups and delegators for the rest of the request
    (`group_names`, `acting_for`): the engine read them fresh, under its lock."""
    user._tollgate_groups = set(groups)
    user._tollgate_delegators = delegators


def acting_for(user, *, fresh: bool = False) -> list[Principal]:
    """`delegators(user)`, read once per request (kept on the user object)."""
    if fresh or not hasattr(user, "_tollgate_delegators"):
        user._tollgate_delegators = delegators(user)
    return user._tollgate_delegators


def choose_rule(user, run, step, rules, decided: set[int], people: list[Principal]):
    """The open rule `user`'s decision counts toward, and whom it is made as (a Principal:
    the user, or the person away they decide for), or why they may not decide: the one gate
    rule. `decided`: who decided this attempt already, themselves or through a delegate."""
    name = user.get_username()
    if user.pk in decided:
        return f"{name} has already decided {step.key}."
    waiting = [rule for rule in rules if rule.open]
    refusal = None
    for rule in waiting:
        for person in people:
            if not (rule.group in person.groups if rule.group else rule.user_id == person.pk):
                continue
            if person.delegated and run.requested_by_id == user.pk:
                refusal = refusal or (f"{name} requested run {run.pk}: a delegate never "
                                      "decides their own runs.")
            elif person.delegated and person.pk in decided:
                refusal = refusal or f"{person.name} has already decided {step.key}."
            elif run.requested_by_id == person.pk and not rule.allow_self_approval:
                refusal = refusal or (
                    f"{name} requested run {run.pk} and cannot decide its gate {step.key}."
                    if not person.delegated else
                    f"{person.name} requested run {run.pk}, so their delegate {name} cannot "
                    f"decide its gate {step.key}.")
            else:
                return rule, person
    if refusal:
        return refusal
    groups = [rule.group for rule in waiting if rule.group]
    people_waited = [rule.audience for rule in waiting if not rule.group]
    if groups and not people_waited:
        return (f"{name} is not in the {' or '.join(repr(g) for g in groups)} group, which "
                f"decides {step.key}.")
    return f"{name} may not decide {step.key}: it waits on {', '.join(groups + people_waited)}."


def who_decided(pairs) -> set[int]:
    """The people these decisions count as, from (decider id, for whom id) pairs: each
    decider, and whom a delegate decided for (one person counts once either way)."""
    return {pk for user_id, for_id in pairs for pk in (user_id, for_id) if pk}


def decided_people(step) -> set[int]:
    """Who decided the gate's current attempt (`who_decided`, read from the database)."""
    return who_decided(Approval.objects.filter(step=step, attempt=step.attempt).values_list(
        "user_id", "on_behalf_of_id"))


def _closed_to(user, run, step) -> str | None:
    """Why this user could decide no rule of this gate now, whatever its rules say: not
    signed in, or the gate not waiting."""
    if not signed_in(user):
        return NOT_SIGNED_IN
    if step.status != StepStatus.WAITING_APPROVAL or run.status not in OPEN_RUN_STATUSES:
        return f"{step.key} is not waiting for approval."
    return None


def decision_as(user, run, step, *, rules, decided: set[int], people: list[Principal]):
    """(the open rule this user's decision counts toward now, whom it is made as), or why
    they may not decide: the gate rule (`choose_rule`) after what every door checks, over
    facts already read (`engine.facts`)."""
    return _closed_to(user, run, step) or choose_rule(user, run, step, rules, decided, people)


def decide_refusal(user, run, step, *, groups: set[str] | None = None, rules=None,
                   decided: set[int] | None = None) -> str | None:
    """Why this user may not decide this gate now, or None when they may (`choose_rule`
    over the gate's rules, who decided and the user's delegations, read here when not
    given)."""
    if why := _closed_to(user, run, step):
        return why
    if rules is None:
        rules = list(GateRule.objects.filter(step=step, attempt=step.attempt, open=True)
                     .select_related("user").order_by("order", "position"))
    chosen = choose_rule(user, run, step, rules,
                         decided_people(step) if decided is None else decided,
                         principals(user, groups=groups))
    return chosen if isinstance(chosen, str) else None


def _fillable(pk) -> QuerySet:
    """Open rules a person is an approver of (by group or by name), self-approval aside."""
    return GateRule.objects.filter(Q(group__in=Group.objects.filter(user=pk).values("name"))
                                   | Q(user_id=pk), open=True)


def _decided_as(pk) -> Exists:
    return Exists(Approval.objects.filter(Q(user=pk) | Q(on_behalf_of=pk),
                                          step=OuterRef("pk"), attempt=OuterRef("attempt")))


def _may_fill(pk) -> Q:
    """Gates with an open rule this person may fill: self-approval allowed, or not theirs."""
    rules = _fillable(pk)
    return (Q(pk__in=rules.filter(allow_self_approval=True).values("step_id"))
            | (Q(pk__in=rules.values("step_id")) & ~Q(run__requested_by=pk)))


def decidable_by(user, *, people: list[Principal] | None = None) -> QuerySet[Step]:
    """Gates this user may decide now (`choose_rule` as a query): an open rule they or a
    person they decide for (`people`: their delegators, read when not given) may fill, not
    yet decided by either, never a delegate's own run."""
    if not signed_in(user):
        return Step.objects.none()
    people = acting_for(user) if people is None else people
    may = _may_fill(user.pk) & ~_decided_as(user.pk)
    for person in people:
        may |= (_may_fill(person.pk) & ~_decided_as(person.pk) & ~_decided_as(user.pk)
                & ~Q(run__requested_by=user.pk))
    return (Step.objects.filter(status=StepStatus.WAITING_APPROVAL,
                                run__status__in=OPEN_RUN_STATUSES)
            .filter(may).order_by("waiting_since", "pk"))


def deciders(run, step) -> QuerySet:
    """The people who may decide this gate now and have not yet (a notification's audience):
    its open rules' approvers, and the delegates of those who are away."""
    users = get_user_model().objects.filter(is_active=True)
    if step.status != StepStatus.WAITING_APPROVAL or run.status not in OPEN_RUN_STATUSES:
        return users.none()
    who = Q(pk__in=[])
    for rule in GateRule.objects.filter(step=step, attempt=step.attempt, open=True):
        member = Q(groups__name=rule.group) if rule.group else Q(pk=rule.user_id)
        if not rule.allow_self_approval and run.requested_by_id:
            member &= ~Q(pk=run.requested_by_id)
        who |= member
    decided = decided_people(step)
    approvers = users.filter(who).exclude(pk__in=decided)
    now = clock.now()
    delegates = Preference.objects.filter(
        user__in=approvers.values("pk"), away_from__lte=now, away_until__gt=now,
        delegate__isnull=False).values("delegate_id")
    found = users.filter(Q(pk__in=approvers.values("pk")) | Q(pk__in=delegates))
    if run.requested_by_id:  # a delegate never decides their own run
        found = found.exclude(~Q(pk__in=approvers.values("pk")) & Q(pk=run.requested_by_id))
    return found.exclude(pk__in=decided).distinct()


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


def can_reassign(user, run, step) -> bool:
    """Point a waiting gate at another group or person: an operator's move."""
    return (step.kind == "approval" and step.status == StepStatus.WAITING_APPROVAL
            and run.status in OPEN_RUN_STATUSES and can_operate(user))


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
    involved = Q(requested_by=user) | Q(pk__in=Step.objects.filter(
        kind="approval", approval_group__in=user.groups.values("name")).values("run_id"))
    involved |= Q(pk__in=Step.objects.filter(pk__in=named_in_rules(user)).values("run_id"))
    return runs.filter(involved)


def named_in_rules(user) -> QuerySet:
    """The ids of gates whose rules (open or not, any attempt) name this user or one of their
    groups, or a person they decide for now."""
    named = Q(pk__in=[])
    for pk in [user.pk, *(person.pk for person in acting_for(user))]:
        named |= Q(group__in=Group.objects.filter(user=pk).values("name")) | Q(user_id=pk)
    return GateRule.objects.filter(named).values("step_id")


def can_change_specs(user) -> bool:
    """Change specs, and so read their inline env values in clear."""
    return has(user, "workflows.change_workflowspec")


def can_export_audit(user) -> bool:
    """Staff and managers (workflows.export_audit) may export every decision."""
    return bool(user.is_authenticated and (user.is_staff or user.has_perm(
        "workflows.export_audit")))

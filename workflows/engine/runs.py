"""Runs: opened (idempotently, with one row per step) and cancelled."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q

from goals.models import Goal, Priority
from workflows.engine import policy
from workflows.engine.commit import commit
from workflows.engine.moves import (
    REASON_LIMIT,
    check_text,
    check_value,
    require_open,
    require_operator,
    require_requester_or_operator,
)
from workflows.engine.rows import actor_of, insert_steps, load, locked
from workflows.engine.rules import SETTLED_STATUSES
from workflows.engine.steps import AGENT_STATUSES, record_transition
from workflows.errors import IllegalTransition, InvalidInput, NotFound, NotPermitted
from workflows.models import (
    OPEN_RUN_STATUSES,
    OPEN_STEP_STATUSES,
    Checkpoint,
    CheckpointKind,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    WorkflowSpec,
)
from workflows.people import permissions
from workflows.specs import grants
from workflows.specs.params import FieldErrors, coerce
from workflows.specs.storage import require_owner, require_program_author
from workflows.specs.validation import SpecError, check_grants, masked, validate_step
from workflows.timing import clock


@dataclass(frozen=True)
class Opened:
    run: Run
    reused: bool


def open_run(
    spec: WorkflowSpec | str,
    *,
    actor=None,
    goal: Goal | int | None = None,
    idempotency_key: str = "",
    shared_state: dict | None = None,
    title: str = "",
    priority: str | None = None,
    params: dict | None = None,
    reuse: str = "open",
    next_action: str = "",
    kind: str = "",
    ref: str = "",
    parent_step: Step | None = None,
    owner=None,
    schedule=None,
) -> Opened:
    """Open a run of a spec (its active version when given by name).

    An idempotency key names one request of one caller, for one spec and goal (none when
    no goal is given): another spec, goal or caller using the same words names another
    request, so a key never finds, nor tells of, someone else's run. `reuse` says what a
    key already used means: "open" (the default) returns the open run holding it, else
    opens a new one; "any" returns the latest run that used it, whatever its status;
    "none" refuses a key any run has used. A run returned is marked reused (and must be the
    same request, else 409); the database's partial unique index settles races.

    `next_action`, `kind` and `ref` are the caller's words for the run (what should happen
    next, what sort of run it is, an outside reference to find it by); `parent_step` makes
    it a child run that step waits for (engine.children). `owner` (a user or a username)
    opens it for someone else, who is then its requester (four-eyes keeps them from
    deciding it): a person needs the permission to open runs on someone else's behalf.
    `schedule` is the schedule that opens it, named in the opening checkpoint.
    """
    if reuse not in REUSE_POLICIES:
        raise InvalidInput(f"reuse must be one of {', '.join(REUSE_POLICIES)}, got {reuse!r}.")
    if permissions.is_person(actor) and not permissions.has(actor, permissions.START):
        raise NotPermitted(f"{actor_of(actor)[1] or 'anonymous'} may not start runs.")
    if isinstance(spec, str):
        spec_obj = WorkflowSpec.objects.filter(name=spec, status="active").first()
        if spec_obj is None:
            raise NotFound(f"No active spec named {spec!r}.")
        spec = spec_obj
    elif spec.status == "archived":
        raise IllegalTransition(f"Spec {spec} is archived; start its active version.")
    next_action = check_text(next_action or "", "next_action", 500)
    kind = check_text(kind or "", "kind", 50)
    ref = check_text(ref or "", "ref", 200)
    if shared_state is not None and not isinstance(shared_state, dict):
        raise InvalidInput("shared_state must be a JSON object.")
    if priority is not None and priority not in Priority.values:
        raise InvalidInput(f"priority must be one of {', '.join(Priority.values)}, "
                           f"got {priority!r}.")
    check_value(shared_state, "shared_state")
    idempotency_key = (idempotency_key or "").strip()
    if len(idempotency_key) > 200:
        raise InvalidInput("idempotency_key is longer than 200 characters.")
    if goal is not None and not isinstance(goal, Goal):
        goal_obj = Goal.objects.filter(pk=goal).first() if str(goal).isdigit() else None
        if goal_obj is None:
            raise NotFound(f"Goal {goal} does not exist.")
        goal = goal_obj
    if goal is not None and goal.is_closed:
        raise IllegalTransition(f"Goal {goal.pk} ({goal.title}) is {goal.status}; "
                                "runs cannot be opened under a closed goal.")
    try:
        values = coerce(spec.definition.get("params", []), params)
    except FieldErrors as exc:
        refused = InvalidInput(str(exc))
        refused.errors = exc.errors  # per param, for a form to show beside each field
        raise refused from None
    request = {"spec": spec, "goal": goal, "title": title, "shared_state": shared_state,
               "params": values if params is not None else None}
    user, _ = actor_of(actor)
    owner = _owner(owner, actor)
    requester = owner or user
    scope = {"spec_name": spec.name, "goal": goal, "requested_by": requester,
             "idempotency_key": idempotency_key}
    if idempotency_key:
        existing = _run_with_key(scope, reuse)
        if existing and reuse == "none":
            raise IllegalTransition(f"Idempotency key {idempotency_key!r} was used by run "
                                    f"{existing.pk} (reuse none: a key is used once).")
        if existing:
            return _reused(existing, idempotency_key, request)
    try:
        with transaction.atomic():
            run = Run.objects.create(
                max_parallel=spec.definition.get("max_parallel"),
                spec=spec,
                spec_name=spec.name,
                goal=goal,
                title=title or spec.description or spec.name,
                priority=priority or (goal.priority if goal else "normal"),
                requested_by=requester,
                opened_by=user if owner is not None else None,
                idempotency_key=idempotency_key,
                shared_state=shared_state or {},
                params=values,
                kind=kind,
                ref=ref,
                caller_next_action=next_action,
                parent_step=parent_step,
                schedule=schedule,
                steps_total=len(spec.definition["steps"]),
            )
            insert_steps(_new_steps(run, spec.definition["steps"]))
            state = load(run.pk)
            # The title the run was opened with is in the chain (exports show it).
            opened = {"title": run.title, "steps": run.steps_total,
                      **({"schedule": {"id": schedule.pk, "name": schedule.name}}
                         if schedule else {}),
                      **({"params": values} if values else {}),
                      **({"opened_for": owner.get_username()} if owner else {}),
                      **({"parent": {"run": parent_step.run_id, "step": parent_step.key}}
                         if parent_step else {})}
            commit(state, CheckpointKind.RUN_OPENED, actor=actor,
                   summary=f"Opened {spec} run" + (f" for {owner}" if owner else "")
                   + (f" under goal “{goal.title}”" if goal else "")
                   + (f" for step {parent_step.key} of run {parent_step.run_id}"
                      if parent_step else ""),
                   state_patch=shared_state or {}, evidence=opened)
            state.flush()
            run = state.run
    except IntegrityError:
        existing = _open_run_with_key(scope) if idempotency_key else None
        if existing is None:
            raise
        if reuse == "none":
            raise IllegalTransition(f"Idempotency key {idempotency_key!r} was used by run "
                                    f"{existing.pk} (reuse none: a key is used once).") from None
        return _reused(existing, idempotency_key, request)
    return Opened(run, False)


def _owner(owner, actor):
    """The person a run is opened for (None: for whoever opens it). Opening for someone
    else is a permission of its own; a command (no person) may."""
    if owner in (None, ""):
        return None
    User = get_user_model()
    if not isinstance(owner, User):
        owner = User.objects.filter(username=owner).first()
        if owner is None:
            raise InvalidInput("owner: no such user.")
    if not owner.is_active:
        raise InvalidInput(f"owner: {owner.get_username()} is disabled.")
    if permissions.is_person(actor) and owner.pk == actor.pk:
        return None
    if permissions.is_person(actor) and not permissions.has(actor, permissions.OPEN_FOR_OTHERS):
        raise NotPermitted(f"{actor.get_username()} may not open runs for someone else "
                           "(that needs the permission to open runs on someone else's "
                           "behalf).")
    return owner


def _reused(existing: Run, key: str, request: dict) -> Opened:
    """The run a key already names (of this caller, spec and goal), if this request is the
    same one; else 409. What a request leaves out (title, shared state) is not compared."""
    differs = []
    if request["title"] and existing.title != request["title"]:
        differs.append(f"title ({existing.title!r}, not {request['title']!r})")
    if request["shared_state"] is not None:
        opened_with = (Checkpoint.objects.filter(run=existing, seq=1)
                       .values_list("state_patch", flat=True).first() or {})
        if opened_with != request["shared_state"]:
            differs.append("shared_state")
    if request["params"] is not None and existing.params != request["params"]:
        differs.append("params")
    if differs:
        raise IllegalTransition(f"Idempotency key {key!r} is already used by "
                                f"{'open ' if not existing.is_terminal else ''}run "
                                f"{existing.pk} with a different {'; '.join(differs)}.")
    return Opened(existing, True)


def _new_steps(run: Run, items: list[dict]) -> list[Step]:
    dependents: dict[str, list[str]] = {item["key"]: [] for item in items}
    for item in items:
        for dep in item.get("depends_on", []):
            if dep in dependents:  # a step added later may depend on steps already there
                dependents[dep].append(item["key"])
    steps = []
    for index, item in enumerate(items):
        approval = item.get("approval") or {}
        steps.append(Step(
            run=run,
            key=item["key"],
            title=item.get("title") or item["key"],
            index=index,
            depends_on=item.get("depends_on", []),
            dependents=dependents[item["key"]],
            waiting_on=len(item.get("depends_on", [])),
            kind=(StepKind.APPROVAL if approval else StepKind.RUN if "run" in item
                  else StepKind.WAIT),
            config=item,
            continue_on_failure=item.get("continue_on_failure", False),
            max_retries=item.get("max_retries", 0),
            retry_backoff_seconds=item.get("retry_backoff_seconds", 0),
            # Until it opens, the gate shows its first rule; open_gate matches them all.
            approval_group=policy.spec_rules(approval)[0].get("group", "") if approval else "",
            approval_required=approval.get("required", 1),
            allow_self_approval=approval.get("allow_self_approval", False),
            compensation=item.get("compensation"),
        ))
    return steps


def require_added_steps_allowed(actor, steps: list[dict]) -> None:
    """Gates added at run time: an operator's alone, and never self-approvable (the
    requester could otherwise add a gate and pass it herself)."""
    for item in steps:
        approval = item.get("approval")
        if not approval:
            continue
        if any(rule.get("allow_self_approval") for rule in policy.spec_rules(approval)):
            raise InvalidInput(f"step {item['key']!r}: a gate added to a running run cannot "
                               "allow self-approval.")
        require_operator(actor, f"add the gate {item['key']!r}")


REUSE_POLICIES = ("open", "any", "none")


def _run_with_key(scope: dict, reuse: str) -> Run | None:
    """The run a key names in its scope (caller, spec, goal) under a reuse policy: the open
    one, or (any, none) the latest run that used it, open or not."""
    if reuse == "open":
        return _open_run_with_key(scope)
    return _open_run_with_key(scope) or (
        Run.objects.filter(**scope).order_by("-created_at", "-id").first())


def _open_run_with_key(scope: dict) -> Run | None:
    return Run.objects.filter(**scope, status__in=OPEN_RUN_STATUSES).first()


def cancel_run(run, *, actor=None, reason: str = "") -> Checkpoint | None:
    """Cancel a run and its open steps. Cancelling a cancelled run changes nothing."""
    reason = check_text(reason, "The reason", REASON_LIMIT)
    require_operator(actor, "cancel runs")
    with locked(run) as state:
        run = state.run
        if run.status == RunStatus.CANCELLED:
            return None
        require_open(run, "cancel")
        now = clock.now()
        open_steps = Step.objects.filter(run=run, status__in=OPEN_STEP_STATUSES)
        cancelled = list(open_steps.order_by("index").values_list("key", flat=True))
        # Keep lease tokens: a worker's heartbeat sees its step cancelled and stops the process.
        closed = {"status": StepStatus.CANCELLED, "lease_expires_at": None, "deadline_at": None,
                  "updated_at": now}
        open_steps.filter(Q(status=StepStatus.RUNNING) | Q(started_at__isnull=False)).update(
            **closed, finished_at=now)
        open_steps.update(**closed, finished_at=None)  # the rest never started
        policy.close_rules_of_run(run)
        state.refresh()
        run.status = RunStatus.CANCELLED
        run.error = reason
        evidence = {"cancelled_steps": cancelled}
        children = list(Run.objects.filter(parent_step__run=run, status__in=OPEN_RUN_STATUSES)
                        .values_list("pk", flat=True))
        if children:
            evidence["children"] = children  # cancelled too, from the outbox
        return commit(state, CheckpointKind.RUN_CANCELLED, actor=actor,
                      summary=reason or "Run cancelled", evidence=evidence)


ADDED_STATUSES = (StepStatus.PENDING, *AGENT_STATUSES)


def add_steps(run, items, *, actor=None) -> list[Checkpoint]:
    """Add steps to an open run while it runs (one checkpoint each): validated like a spec's
    steps, keys unique in the run, dependencies only on steps that exist (or come earlier in
    `items`), so the graph stays acyclic.

    Added steps are authorised like a spec that contains them: steps or compensations that
    run programs need author_command_spec; only an operator adds a gate, and an added gate
    never allows self-approval. A run holds at most TOLLGATE_MAX_STEPS_PER_RUN steps.

    A step may carry the seed's `step_index` (its place in the run's order, after every step
    it depends on) and `status`: a wait step whose dependencies are done may start running,
    completed, failed or blocked, reported as `/transition` reports it, in the same
    transaction; a status that would pass a gate, or a worker's step, or a step still
    waiting on others, is refused and nothing is added."""
    if not isinstance(items, list) or not items:
        raise InvalidInput("steps must be a non-empty list of steps.")
    items, places, starts = _seed_fields(items)
    with transaction.atomic():
        checkpoints = _add_steps(run, items, places, actor=actor)
        for key, status in starts:
            checkpoints.append(record_transition(
                run, key, actor=actor, step_status=status,
                summary=f"{key} added as {status}"))
    return checkpoints


def _seed_fields(items) -> tuple[list, dict[str, int], list[tuple[str, str]]]:
    """(the steps without them, {key: step_index}, [(key, initial status)])."""
    steps, places, starts = [], {}, []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not ({"status", "step_index"} & set(item)):
            steps.append(item)
            continue
        where = f"step {item.get('key', position + 1)!r}"
        status = item.get("status", StepStatus.PENDING)
        if status not in ADDED_STATUSES:
            raise InvalidInput(f"{where}: status must be one of "
                               f"{', '.join(map(str, ADDED_STATUSES))}, got {status!r}.")
        if "step_index" in item:
            place = item["step_index"]
            if isinstance(place, bool) or not isinstance(place, int) or not 0 <= place <= 10**6:
                raise InvalidInput(f"{where}: step_index must be a whole number from 0 (the "
                                   f"first step's) to 1000000, got {place!r}.")
            places[item.get("key")] = place
        if status != StepStatus.PENDING:
            starts.append((item.get("key"), status))
        steps.append({k: v for k, v in item.items() if k not in ("status", "step_index")})
    return steps, places, starts


def _add_steps(run, items, places: dict[str, int], *, actor=None) -> list[Checkpoint]:
    cap = settings.TOLLGATE_MAX_STEPS_PER_RUN
    if len(items) > cap:
        raise InvalidInput(f"steps: {len(items)} steps given; a run holds at most {cap}.")
    try:
        normal = [validate_step(i, item) for i, item in enumerate(items)]
    except SpecError as exc:
        raise InvalidInput(str(exc)) from None
    require_added_steps_allowed(actor, normal)
    require_program_author(actor, {"steps": normal})
    with locked(run) as state:
        run = state.run
        require_requester_or_operator(actor, run, "add steps to")
        require_open(run, "add steps")
        try:
            check_grants(run.spec_name, normal)
        except SpecError as exc:
            raise InvalidInput(str(exc)) from None
        if any(grants.secrets_named(item) for item in normal):
            require_owner(actor, run.spec_name)  # the name's grants reach only its owners
        existing = dict(Step.objects.filter(run=run).values_list("key", "status"))
        if len(existing) + len(normal) > cap:
            raise InvalidInput(f"steps: run {run.pk} has {len(existing)} steps; adding "
                               f"{len(normal)} would pass the cap of {cap} "
                               "(TOLLGATE_MAX_STEPS_PER_RUN).")
        known = set(existing)
        for item in normal:
            key = item["key"]
            if key in known:
                raise InvalidInput(f"step {key!r}: the run already has a step {key!r}.")
            unknown = [dep for dep in item["depends_on"] if dep not in known]
            if unknown:
                raise InvalidInput(f"step {key!r}: depends_on names unknown step {unknown[0]!r} "
                                   "(an added step may depend only on steps that exist)")
            known.add(key)
        index = (Step.objects.filter(run=run).order_by("-index")
                 .values_list("index", flat=True).first() or 0) + 1
        name = actor_of(actor)[1]
        checkpoints = []
        indexes = dict(Step.objects.filter(run=run).values_list("key", "index"))
        for offset, step in enumerate(_new_steps(run, normal)):
            step.index = places.get(step.key, index + offset)
            before = [dep for dep in step.depends_on if indexes[dep] >= step.index]
            if before:
                raise InvalidInput(f"step {step.key!r}: step_index {step.index} does not come "
                                   f"after step {before[0]!r} it depends on (index "
                                   f"{indexes[before[0]]}).")
            indexes[step.key] = step.index
            step.added_by = name[:200]
            step.waiting_on = sum(1 for dep in step.depends_on
                                  if existing.get(dep) not in SETTLED_STATUSES)
            step.save()
            run.steps_total += 1
            for dep in step.depends_on:
                parent = Step.objects.filter(run=run, key=dep).only("dependents").first()
                Step.objects.filter(pk=parent.pk).update(dependents=[*parent.dependents,
                                                                     step.key])
            existing[step.key] = step.status
            state.refresh()
            loaded = state.find(step.pk) or state.add(Step.objects.get(pk=step.pk))
            checkpoints.append(commit(state, CheckpointKind.STEP_ADDED, actor=actor, step=loaded,
                                      summary=f"{step.title} added by {name}",
                                      evidence={"step": masked(normal[offset])}))
        return checkpoints

"""Pages for runs and the inbox. Thin: reading goes through selectors, writing through the engine.

Every button is a real form post. Without JavaScript it redirects back; with htmx the same view
answers with the fragment to swap, taken from the page template's partials.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from tollgate.exports import csv_download
from tollgate.query import int_param, whole_number
from workflows import engine, permissions, selectors, timezones
from workflows.delivery import links
from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    Run,
    RunStatus,
    Step,
    StepStatus,
    WorkflowSpec,
)
from workflows.permissions import (
    can_cancel,
    can_decide,
    can_export_audit,
    can_operate,
    can_retry,
    can_skip,
    decidable_by,
    decide_refusal,
    readable_runs,
)
from workflows.recovery.recover import recover_run
from workflows.web import cards
from workflows.web.forms import StartRunForm, gate_form, posted_values


def _dag_order(steps: list) -> list:
    """Steps in dependency order, layer by layer (a step comes after all it depends on),
    keeping spec order among peers. Linear in the steps and their edges."""
    by_key = {s.key: s for s in steps}
    waiting = {s.key: sum(1 for d in s.depends_on if d in by_key) for s in steps}
    dependents: dict[str, list] = {}
    for s in steps:
        for dep in s.depends_on:
            dependents.setdefault(dep, []).append(s)
    layer = {}
    queue = [s for s in steps if waiting[s.key] == 0]
    for s in queue:
        layer[s.key] = 0
    for s in queue:  # grows while it is walked: Kahn's algorithm
        for child in dependents.get(s.key, ()):
            layer[child.key] = max(layer.get(child.key, 0), layer[s.key] + 1)
            waiting[child.key] -= 1
            if waiting[child.key] == 0:
                queue.append(child)
    placed = sorted(queue, key=lambda s: (layer[s.key], s.index))
    # A cycle cannot pass validation; were there one, its steps show last, as they are.
    return placed + [s for s in steps if waiting[s.key] > 0]


TIMELINE_LATEST = 200


def run_context(request, run_id: int, *, refused: tuple[str, dict] | None = None) -> dict:
    """Everything the run page shows, in a constant number of queries.

    The timeline shows the latest checkpoints unless the whole of it is asked for. With
    `refused` (gate key, {field: problem}), that gate's form shows what was posted and why
    it was refused.
    """
    run = get_object_or_404(readable_runs(request.user).select_related(
        "spec", "goal", "requested_by", "parent_step"), pk=run_id)
    steps = list(run.steps.order_by("index"))
    approvals = list(Approval.objects.filter(step__run=run).select_related("user"))
    whole = request.GET.get("timeline") == "all"
    first_seq = 1 if whole else max(1, run.checkpoint_seq - TIMELINE_LATEST + 1)
    checkpoints = selectors.timeline_for_page(run, first_seq=first_seq)
    by_step: dict[int, list] = {}
    for approval in approvals:
        by_step.setdefault(approval.step_id, []).append(approval)
    user = request.user
    attempts = {s.pk: s.attempt for s in steps}
    decided = {a.step_id for a in approvals
               if a.user_id == user.pk and a.attempt == attempts[a.step_id]}
    now = timezone.now()
    for step in steps:
        step.looks_stuck = (step.status == StepStatus.RUNNING and step.lease_expires_at is not None
                            and step.lease_expires_at < now)
        step.decisions = by_step.get(step.pk, [])
        if step.kind == "approval":
            step.due = cards.deadline(step, now)
            step.instructions = cards.fill_placeholders(step.config.get("description", ""),
                                                            run)
            step.approved = cards.approvals_of_attempt(step.decisions, step.attempt)[1]
            if refused and refused[0] == step.key:
                step.form = gate_form(step, request.POST, errors=refused[1])
            else:
                step.form = gate_form(step)
        step.can_decide = can_decide(user, run, step, decided)
        step.can_retry = can_retry(user, run, step)
        step.can_skip = can_skip(user, run, step)
    return {
        "run": run,
        "steps": _dag_order(steps),
        "checkpoints": checkpoints,
        # In the order the spec declares them (PostgreSQL's jsonb keeps no key order).
        "params": [(p["name"], run.params[p["name"]])
                   for p in run.spec.definition.get("params", []) if p["name"] in run.params],
        "can_cancel": can_cancel(user, run),
        "can_recover": can_operate(user) and any(step.looks_stuck for step in steps),
        "earlier_checkpoints": first_seq - 1,
        "is_open": run.status in OPEN_RUN_STATUSES,
    }


@require_GET
def run_detail(request, pk: int):
    template = "workflows/run_detail.html"
    before = int_param(request.GET, "before")
    if before is not None:
        # "Load older": the page of checkpoints before `before`, in place of the link.
        run = get_object_or_404(readable_runs(request.user), pk=pk)
        first_seq = max(1, before - TIMELINE_LATEST)
        return render(request, template + "#timeline-older", {
            "run": run, "earlier_checkpoints": first_seq - 1,
            "checkpoints": selectors.timeline_for_page(run, first_seq=first_seq,
                                                       before=before)})
    if request.htmx:
        # Polling asks with the last checkpoint it has; nothing new means nothing to swap.
        seen = int_param(request.GET, "seq")
        if seen is not None and readable_runs(request.user).filter(
                pk=pk, checkpoint_seq=seen).exists():
            return HttpResponse(status=204)
        template += "#run-body"
    return render(request, template, run_context(request, pk))


@require_GET
def run_list(request):
    names = ("q", "status", "spec", "goal", "requester", "opened_from", "opened_to",
             "finished_from", "finished_to", "mine")
    # A NUL cannot be searched for (PostgreSQL refuses it in text): it is dropped.
    filters = {key: request.GET.get(key, "").replace("\x00", "").strip()[:200]
               for key in names}
    goal = int_param(request.GET, "goal")
    filters["goal"] = "" if goal is None else str(goal)
    days, bad_days = {}, []
    for key in ("opened_from", "opened_to", "finished_from", "finished_to"):
        days[key] = selectors.parse_day(filters[key])
        if days[key] is None:
            if filters[key]:
                bad_days.append(f"{key.replace('_', ' ')} {filters[key]!r}")
            filters[key] = ""  # not a date: ignored (said so), and not kept in the form
    runs = selectors.runs(status=filters["status"], spec=filters["spec"], goal=goal,
                          q=filters["q"], requester=filters["requester"], **days)
    runs = readable_runs(request.user, runs)
    if filters["mine"]:
        runs = runs.filter(pk__in=decidable_by(request.user).values("run_id"))
    page = Paginator(runs, 25).get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in filters.items() if v})
    return render(request, "workflows/run_list.html", {
        "page": page, "filters": filters, "query": query, "statuses": RunStatus.choices,
        "bad_days": bad_days,
        "spec_names": WorkflowSpec.objects.order_by("name").values_list("name", flat=True)
        .distinct(),
    })


@require_GET
def inbox(request):
    if request.htmx and "poll" in request.GET:
        return _inbox_update(request)
    template = "workflows/inbox.html"
    if request.htmx:
        template += "#gates"
    return render(request, template, {"gates": cards.inbox_gates(request.user),
                                      "inbox_limit": cards.INBOX_LIMIT})


def _inbox_update(request):
    """What changed since the open inbox's last look, as out-of-band swaps around the cards
    it has (each sends "id:version"): new gates are added, changed quorum lines replaced,
    gates that no longer wait on this user turn into their decided state. A card a person
    is typing in is never replaced while it waits; nothing changed is a 204, found from the
    gates' versions alone (no card is built for it)."""
    have = {}
    for item in request.GET.getlist("have")[:500]:
        pk, _, version = item.partition(":")
        if (gate_id := whole_number(pk)) is not None:
            have[gate_id] = version
    current = cards.inbox_versions(request.user)
    left_ids = [pk for pk in have if pk not in current]
    if not left_ids and all(have.get(pk) == version for pk, version in current.items()):
        return HttpResponse(status=204)
    gates = cards.inbox_gates(request.user)
    arrived = [gate for gate in gates if gate.pk not in have]
    changed = [gate for gate in gates if gate.pk in have and have[gate.pk] != gate.version]
    left = cards.gates_left(request.user, left_ids)
    if not (arrived or changed or left):
        return HttpResponse(status=204)
    return render(request, "workflows/inbox.html#inbox-update",
                  {"gates": gates, "arrived": arrived, "changed": changed, "left": left})


@require_POST
def inbox_bulk(request):
    """Approve or reject the ticked gates with one comment (engine.decide_many); a gate that
    could not be decided says why in its own card, in the error style."""
    picked = [pk for pk in map(whole_number, request.POST.getlist("gate")) if pk is not None]
    done, refused, problem = [], {}, ""
    if not picked:
        problem = "Tick the gates to decide first."
    else:
        try:
            decided, refused = engine.decide_many(
                picked, user=request.user, decision=request.POST.get("decision", ""),
                comment=request.POST.get("comment", ""))
            verb = "approved" if request.POST.get("decision") == "approve" else "rejected"
            done = [f"You {verb} {gate.title} ({gate.run})." for gate in decided]
        except engine.WorkflowError as exc:
            problem = str(exc)
    gates = cards.inbox_gates(request.user)
    for gate in gates:
        gate.notice = refused.get(gate.pk, "")
    waiting = {gate.pk for gate in gates}
    # Refused gates that no longer wait on this user keep a card of their own, saying why.
    refused_cards = cards.gates_left(request.user, [pk for pk in refused
                                                        if pk not in waiting])
    for gate in refused_cards:
        gate.notice = refused[gate.pk]
    context = {"gates": gates, "bulk_done": done, "bulk_problem": problem,
               "refused_cards": refused_cards}
    if request.htmx:
        return render(request, "workflows/inbox.html#gates", context)
    for line in done:
        messages.info(request, line)
    for gate in [*gates, *refused_cards]:
        if gate.notice:
            messages.error(request, f"{gate.title} ({gate.run}): {gate.notice}")
    if problem:
        messages.error(request, problem)
    return redirect("inbox")


@require_GET
def decide(request, token: str):
    """The page a signed decision link opens (after sign-in): the gate with its evidence
    and the Approve and Reject buttons. Opening it changes nothing; the link works only for
    the person it was sent to, and only while that attempt of the gate waits."""
    try:
        link = links.read(token)
    except links.BadLink as exc:
        return render(request, "workflows/decide.html", {"problem": str(exc)}, status=400)
    if link.user_id != request.user.pk:
        return render(request, "workflows/decide.html", {
            "problem": "This link was sent to another person: sign in as them to use it, "
                       "or find the gate in your own inbox."}, status=403)
    gate = (Step.objects.select_related("run", "run__goal", "run__requested_by")
            .filter(pk=link.step_id, kind="approval").first())
    if gate is None:
        return render(request, "workflows/decide.html",
                      {"problem": "This gate no longer exists."}, status=404)
    if gate.attempt != link.attempt or gate.status != StepStatus.WAITING_APPROVAL:
        return render(request, "workflows/decide.html", {
            "run": gate.run, "problem": f"This link no longer works: {gate.title} was decided "
                                        "or has started again since it was sent."}, status=410)
    decided = Approval.objects.filter(step=gate, attempt=gate.attempt, user=request.user)
    refusal = ("You have already decided this gate." if decided.exists()
               else decide_refusal(request.user, gate.run, gate))
    if refusal:
        return render(request, "workflows/decide.html", {"run": gate.run, "problem": refusal},
                      status=403)
    cards.gate_evidence([gate])
    return render(request, "workflows/decide.html", {"gate": gate})


@require_GET
def my_decisions(request):
    """What the signed-in user approved or rejected, newest first."""
    decisions = (Approval.objects.filter(user=request.user)
                 .select_related("step", "step__run").order_by("-at", "-pk"))
    page = Paginator(decisions, 50).get_page(request.GET.get("page"))
    return render(request, "workflows/my_decisions.html", {"page": page})


def _back(request, run: Run) -> str:
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return run.get_absolute_url()


def _respond(request, run_id: int, *, key: str = "",
             error: engine.WorkflowError | None = None, done: str = "", checkpoint=None):
    """The answer to a button press: a fragment for htmx, a redirect or page otherwise."""
    if isinstance(error, engine.NotFound):
        raise Http404(str(error))
    status = error.status_code if error else 200
    message = str(error) if error else done
    if request.htmx:
        if request.POST.get("view") == "inbox" and key:
            if error:  # the card again, with why, and its evidence
                gate = (Step.objects.select_related("run", "run__goal", "run__requested_by")
                        .filter(run_id=run_id, key=key).first())
                if gate is not None:
                    cards.gate_evidence([gate])
                    if getattr(error, "errors", None):
                        gate.form = gate_form(gate, request.POST, errors=error.errors)
                return render(request, "workflows/inbox.html#gate-card",
                              {"gate": gate, "notice": message}, status=status)
            # The gate as the decision left it: the engine's rows, no query.
            return render(request, "workflows/inbox.html#decided",
                          {"gate": checkpoint.step, "notice": message})
        context = run_context(request, run_id, refused=_refused(key, error))
        context.update(notice=message, notice_error=bool(error))
        return render(request, "workflows/run_detail.html#run-body", context, status=status)
    if error:
        context = run_context(request, run_id, refused=_refused(key, error))
        context.update(notice=message, notice_error=True)
        return render(request, "workflows/run_detail.html", context, status=status)
    messages.success(request, message)
    return redirect(_back(request, Run.objects.get(pk=run_id)))


def _refused(key: str, error) -> tuple[str, dict] | None:
    """(gate key, {field: problem}) when a gate's form was refused, for the page to show."""
    errors = getattr(error, "errors", None)
    return (key, errors) if errors else None


def _require_readable(request, pk: int) -> None:
    """404 for a run this person may not read: a refusal shows nothing of it either."""
    if not permissions.sees_every_run(request.user) and not readable_runs(
            request.user).filter(pk=pk).exists():
        raise Http404(f"Run {pk} does not exist.")


@require_POST
def step_action(request, pk: int, key: str, action: str):
    _require_readable(request, pk)
    run = pk  # the engine locks and reads it; a run that does not exist is a 404 from there
    comment = request.POST.get("comment", "").strip()
    try:
        if action == "approve":
            checkpoint = engine.approve(run, key, user=request.user, comment=comment,
                                        values=posted_values(request.POST), posted=True)
            done = f"You approved {checkpoint.step.title}."
        elif action == "reject":
            checkpoint = engine.reject(run, key, user=request.user, comment=comment)
            done = f"You rejected {checkpoint.step.title}."
        elif action == "retry":
            checkpoint = engine.retry_step(run, key, actor=request.user)
            done = f"{checkpoint.step.title}: retry requested."
        elif action == "skip":
            checkpoint = engine.skip_step(run, key, actor=request.user, reason=comment)
            done = f"{checkpoint.step.title} skipped."
        else:
            return HttpResponse(status=404)
    except engine.WorkflowError as exc:
        return _respond(request, pk, key=key, error=exc)
    return _respond(request, pk, key=key, done=done, checkpoint=checkpoint)


@require_http_methods(["GET", "POST"])
def run_cancel(request, pk: int):
    run = get_object_or_404(readable_runs(request.user).select_related("spec"), pk=pk)
    if request.method == "GET":  # the confirmation page for browsers without JavaScript
        if not can_operate(request.user):
            return HttpResponseForbidden("Cancelling needs the operator permission.")
        children = Run.objects.filter(parent_step__run=run,
                                      status__in=OPEN_RUN_STATUSES).exists()
        return render(request, "workflows/run_cancel.html", {"run": run, "children": children})
    try:
        engine.cancel_run(run, actor=request.user,
                          reason=request.POST.get("reason", ""))
    except engine.WorkflowError as exc:
        return _respond(request, run.pk, error=exc)
    return _respond(request, run.pk, done="Run cancelled.")


@require_POST
def run_recover(request, pk: int):
    run = get_object_or_404(readable_runs(request.user), pk=pk)
    try:
        verdicts = recover_run(run, actor=request.user)
    except engine.WorkflowError as exc:
        return _respond(request, run.pk, error=exc)
    done = "; ".join(f"{v.step}: {v.action}" for v in verdicts) or "No step is running."
    return _respond(request, run.pk, done=done)


@never_cache  # the page shows a new token once: no cache may keep it
@require_http_methods(["GET", "POST"])
def profile(request):
    """Your API tokens (create one, shown once, or revoke one) and your time zone."""
    from workflows.models import ApiToken, Preference

    new_token = None
    preference = Preference.objects.filter(user=request.user).first() or Preference(
        user=request.user)
    if request.method == "POST" and "time_zone" in request.POST:
        preference.time_zone = request.POST["time_zone"].strip()[:64]
        try:
            preference.full_clean()
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
        else:
            preference.save()
            timezones.remember(request, preference.time_zone)
            messages.success(request, f"Times now show in {preference.time_zone or 'the '
                                                          'site time zone'}.")
            return redirect("profile")
    elif request.method == "POST":
        name = request.POST.get("name", "").replace("\x00", "").strip()[:100] or "API token"
        _, new_token = ApiToken.objects.issue(request.user, name, actor=request.user)
    tokens = ApiToken.objects.filter(user=request.user)
    return render(request, "workflows/profile.html", {
        "tokens": tokens, "new_token": new_token, "preference": preference,
        "zones": timezones.choices(), "site_zone": settings.TIME_ZONE})


@require_POST
def token_revoke(request, pk: int):
    from django.utils import timezone

    from workflows.models import ApiToken

    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        messages.success(request, f"Token {token} revoked.")
    return redirect("profile")


@require_GET
def spec_list(request):
    """The active specs, with Start run for those who may start runs."""
    return render(request, "workflows/spec_list.html", {
        "specs": selectors.active_specs(),
        "can_start": request.user.has_perm("workflows.add_run")})


@require_http_methods(["GET", "POST"])
def start_run(request, name: str):
    """A form built from the spec's params; submitting opens the run page."""
    spec = get_object_or_404(WorkflowSpec, name=name, status="active")
    if not permissions.has(request.user, permissions.START):
        return HttpResponseForbidden("Starting runs needs the workflows.add_run permission; "
                                     "ask an administrator.")
    params = spec.definition.get("params", [])
    form = StartRunForm(request.POST or None, params=params)
    error = ""
    if request.method == "POST" and form.is_valid():
        try:
            opened = engine.open_run(
                spec, actor=request.user, goal=form.cleaned_data["goal"],
                title=form.cleaned_data["title"], params=form.param_values(),
                idempotency_key=form.cleaned_data["idempotency_key"])
        except engine.WorkflowError as exc:
            placed = False
            for field, problem in getattr(exc, "errors", {}).items():
                if f"param_{field}" in form.fields:
                    form.add_error(f"param_{field}", problem)
                    placed = True
            # Field problems show beside their fields; the banner only says so.
            error = "Some values need fixing: see below." if placed else str(exc)
            status = exc.status_code
        else:
            if opened.reused:
                messages.info(request, f"That idempotency key already started run "
                                       f"#{opened.run.pk}; here it is.")
            return redirect(opened.run.get_absolute_url())
    elif request.method == "POST":
        status = 400
    else:
        status = 200
    return render(request, "workflows/start_run.html",
                  {"spec": spec, "form": form, "error": error}, status=status)


@require_GET
def run_audit(request, pk: int):
    """A run's timeline and decisions, as JSON or CSV (`?format=csv`)."""
    run = get_object_or_404(readable_runs(request.user), pk=pk)
    audit = selectors.run_audit(run)
    if request.GET.get("format") == "csv":
        header, rows = selectors.audit_rows(audit)
        return csv_download(rows, header, f"run-{run.pk}-audit.csv")
    response = JsonResponse(audit, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-audit.json"'
    return response


@require_GET
def workers(request):
    """Operators: every consumer seen, alive, gone or silent, what each holds; the periodic
    tasks' last runs; a warning when no sweep has run for three periods."""
    from workflows.ops import operations
    from workflows.recovery import presence

    if not (can_operate(request.user) or request.user.is_staff):
        return HttpResponseForbidden("The workers page is for operators.")
    now = timezone.now()
    return render(request, "workflows/workers.html", {
        "workers": operations.workers(now), "periodic": operations.periodic_runs(),
        "sweeper_late": presence.sweeper_late(now), "window": "day"})


@require_GET
def dev_mail(request):
    """With DEBUG only: the mail Tollgate sent, newest first, links whole and clickable."""
    from workflows.models import Notification

    if not settings.DEBUG:
        raise Http404("The development mail page exists with DEBUG only.")
    mails = Notification.objects.select_related("user").order_by("-created_at")
    if not request.user.is_staff:  # each person their own mail; all of it to staff
        mails = mails.filter(user=request.user)
    return render(request, "workflows/dev_mail.html", {"mails": mails[:100]})


@require_GET
def gates_due(request):
    """For managers (staff and export_audit, as the audit): per group, the gates overdue,
    due within a day, and escalated."""
    if not can_export_audit(request.user):
        return HttpResponseForbidden("The deadlines view is for managers (staff or the "
                                     "export_audit permission).")
    return render(request, "workflows/gates_due.html",
                  {"groups": cards.due_gates(timezone.now())})


@require_GET
def audit(request):
    """Every decision in a date range, streamed as CSV (staff and managers)."""
    if not can_export_audit(request.user):
        return HttpResponseForbidden("Exporting the audit trail needs staff or the "
                                     "export_audit permission.")
    start = selectors.parse_day(request.GET.get("from", ""))
    end = selectors.parse_day(request.GET.get("to", ""))
    if request.GET.get("format") != "csv":
        return render(request, "workflows/audit.html", {
            "start": start, "end": end, "count": selectors.decisions(start, end).count()})
    rows = ([d[k] for k in selectors.DECISION_COLUMNS]
            for d in selectors.decision_rows(selectors.decisions(start, end)))
    return csv_download(rows, selectors.DECISION_COLUMNS, "tollgate-decisions.csv")

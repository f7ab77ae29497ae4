"""The run pages: the list, one run with its steps and timeline, and its buttons (decide,
retry, skip, cancel, recover), each a real form post answered with a fragment for htmx."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from tollgate.exports import csv_download
from tollgate.paging import page_of
from tollgate.query import int_param
from workflows import engine
from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    Channel,
    Run,
    RunStatus,
    Step,
    StepStatus,
    WorkflowSpec,
)
from workflows.people import permissions
from workflows.people.permissions import (
    can_cancel,
    can_operate,
    can_reassign,
    can_retry,
    can_skip,
    decidable_by,
    readable_runs,
)
from workflows.reads import briefs, selectors
from workflows.reads import gates as gates_seen
from workflows.recovery.recover import recover_run
from workflows.web import cards, passkeys, polls, signing
from workflows.web.forms import gate_form, posted_values


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


TIMELINE_LATEST = 50


def run_context(request, run_id: int, *, refused: tuple[str, dict] | None = None) -> dict:
    """Everything the run page shows, in a constant number of queries.

    The timeline shows the latest checkpoints unless the whole of it is asked for. With
    `refused` (gate key, {field: problem}), that gate's form shows what was posted and why
    it was refused.
    """
    watching = polls.run_versions(request, run_id)  # before the rows
    run = get_object_or_404(readable_runs(request.user).select_related(
        "spec", "goal", "requested_by", "opened_by", "parent_step"), pk=run_id)
    steps = list(run.steps.order_by("index"))
    approvals = list(Approval.objects.filter(step__run=run).select_related("user",
                                                                             "on_behalf_of"))
    whole = request.GET.get("timeline") == "all"
    first_seq = 1 if whole else max(1, run.checkpoint_seq - TIMELINE_LATEST + 1)
    checkpoints = selectors.timeline_for_page(run, first_seq=first_seq)
    by_step: dict[int, list] = {}
    for approval in approvals:
        by_step.setdefault(approval.step_id, []).append(approval)
    user = request.user
    for step in steps:
        step.decisions = by_step.get(step.pk, [])
    # Each gate as this person sees it: its rules, whether and how they may decide it.
    gates = [s for s in steps if s.kind == "approval" and s.attempt]
    gates_seen.seen_by(user, gates, brief=False, audience=False)
    waited = {gate.pk for gate in gates}
    now = timezone.now()
    for step in steps:
        step.looks_stuck = (step.status == StepStatus.RUNNING and step.lease_expires_at is not None
                            and step.lease_expires_at < now)
        if step.kind == "approval":
            step.instructions = briefs.fill_placeholders(step.config.get("description", ""),
                                                         run)
            if not step.attempt:  # never waited: no rules, no deadline, nobody decides it yet
                step.decisions, step.approved = briefs.approvals_of_attempt(step.decisions, 0)
                briefs.describe_rules(step, [])
                step.due = briefs.deadline(step, now)
            if refused and refused[0] == step.key:
                step.form = gate_form(step, request.POST, errors=refused[1])
            else:
                step.form = gate_form(step)
        step.can_decide = step.pk in waited and not step.refusal
        # What the page's poller compares: a row whose version moved is sent again.
        step.version = f"{step.attempt}.{len(step.decisions)}.{step.updated_at.timestamp()}"
        step.can_retry = can_retry(user, run, step)
        step.can_reassign = can_reassign(user, run, step)
        step.can_skip = can_skip(user, run, step)
    return {
        "run": run,
        "steps": _dag_order(steps),
        "checkpoints": checkpoints,
        # Checked on what the page holds: no query of its own.
        "chain_warning": selectors.chain_warning(run, checkpoints, approvals),
        # In the order the spec declares them (PostgreSQL's jsonb keeps no key order).
        "params": [(p["name"], run.params[p["name"]])
                   for p in run.spec.definition.get("params", []) if p["name"] in run.params],
        "can_cancel": can_cancel(user, run),
        "can_recover": can_operate(user) and any(step.looks_stuck for step in steps),
        "earlier_checkpoints": first_seq - 1,
        "is_open": run.status in OPEN_RUN_STATUSES,
        "live": watching,
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
        # Polling asks with the last checkpoint it has; nothing new means nothing to swap,
        # found from the page's versions when its run has not rung, else from the row.
        seen = int_param(request.GET, "seq")
        if seen is not None and polls.unchanged(request):
            return HttpResponse(status=204)
        if seen is not None and readable_runs(request.user).filter(
                pk=pk, checkpoint_seq=seen).exists():
            return polls.with_versions(HttpResponse(status=204), polls.run_versions(request, pk))
        if seen is not None and request.GET.getlist("have"):
            return _run_update(request, pk, seen)
        template += "#run-body"
    return render(request, template, run_context(request, pk))


def _run_update(request, pk: int, seen: int):
    """What moved since the poller's checkpoint `seen`, around what the page shows: the
    head, the step rows whose version changed (a row being typed in keeps its fields), the
    new checkpoints. A step the page does not have (added at run time) redraws the body."""
    context = run_context(request, pk)
    have = dict(item.split(":", 1) for item in request.GET.getlist("have")[:1000]
                if ":" in item)
    steps = context["steps"]
    if {step.key for step in steps} != set(have):
        return render(request, "workflows/run_detail.html#run-body", context)
    context["changed"] = [step for step in steps if have[step.key] != step.version]
    context["new_checkpoints"] = [c for c in context["checkpoints"] if c.seq > seen]
    return render(request, "workflows/run_detail.html#run-update", context)


@require_GET
def run_list(request):
    names = ("q", "status", "spec", "goal", "requester", "opened_from", "opened_to",
             "finished_from", "finished_to", "mine", "parent", "schedule", "sort")
    # A NUL cannot be searched for (PostgreSQL refuses it in text): it is dropped.
    filters = {key: request.GET.get(key, "").replace("\x00", "").strip()[:200]
               for key in names}
    ids, bad = {}, []
    for key in ("goal", "parent", "schedule"):  # a number, or said to be ignored
        ids[key] = int_param(request.GET, key)
        if ids[key] is None and filters[key]:
            bad.append(f"{key} {filters[key]!r} is not a number")
        filters[key] = "" if ids[key] is None else str(ids[key])
    if filters["status"] and filters["status"] not in RunStatus.values:
        bad.append(f"status {filters['status']!r} is not a run status (one of "
                   f"{', '.join(RunStatus.values)})")
        filters["status"] = ""
    days, bad_days = {}, []
    for key in ("opened_from", "opened_to", "finished_from", "finished_to"):
        days[key] = selectors.parse_day(filters[key])
        if days[key] is None:
            if filters[key]:
                bad_days.append(f"{key.replace('_', ' ')} {filters[key]!r}")
            filters[key] = ""  # not a date: ignored (said so), and not kept in the form
    if filters["sort"] not in ("", "activity"):
        bad.append(f"sort {filters['sort']!r} is not a sort (activity, or none: newest first)")
        filters["sort"] = ""
    runs = selectors.runs(status=filters["status"], spec=filters["spec"], goal=ids["goal"],
                          parent=ids["parent"], schedule=ids["schedule"],
                          q=filters["q"], requester=filters["requester"],
                          sort=filters["sort"] or "created", **days)
    runs = readable_runs(request.user, runs)
    if filters["mine"]:
        runs = runs.filter(pk__in=decidable_by(request.user).values("run_id"))
    page = page_of(runs, request.GET.get("page"))
    query = urlencode({k: v for k, v in filters.items() if v})
    return render(request, "workflows/run_list.html", {
        "page": page, "filters": filters, "query": query, "statuses": RunStatus.choices,
        "bad_days": bad_days, "bad_filters": bad,
        "spec_names": WorkflowSpec.objects.order_by("name").values_list("name", flat=True)
        .distinct(),
    })


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
    if getattr(error, "errors", None):
        # Each field shows its own problem beside it: the notice does not name them again.
        message = "Nothing was recorded: check the fields below."
    if request.htmx:
        if request.POST.get("view") == "inbox" and key:
            if error:  # the card again, with why, and its evidence
                gate = (Step.objects.select_related("run", "run__goal", "run__requested_by")
                        .filter(run_id=run_id, key=key).first())
                if gate is not None:
                    # As the card was drawn: who else may decide, who was told, the
                    # signature, and the fields as typed.
                    cards.seen_by(request.user, [gate])
                    if getattr(error, "errors", None):
                        gate.form = gate_form(gate, request.POST, errors=error.errors)
                # A mailed link's page decides that one gate: no checkbox for several.
                return render(request, "workflows/inbox.html#gate-card",
                              {"gate": gate, "notice": message,
                               "via": request.POST.get("via", ""),
                               "single": request.POST.get("via") in ("mail_link", "push")},
                              status=status)
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


PAGE_CHANNELS = (Channel.WEB, Channel.RUN_PAGE, Channel.MAIL_LINK, Channel.PUSH)


def decide(request, pk: int, key: str, action: str, data, signature):
    """Approve or reject from a page's form (`data`: its fields), as `request.user`."""
    # Which page the button was on (inbox card, run page, or a mailed link's page), for the
    # audit; the API, bulk and chat set theirs where they decide.
    via = data.get("via", Channel.WEB)
    via = via if via in PAGE_CHANNELS else Channel.WEB
    comment, seen = data.get("comment", "").strip(), data.get("evidence_digest", "")
    if action == "approve":
        checkpoint = engine.approve(pk, key, user=request.user, comment=comment,
                                    values=posted_values(data), posted=True, channel=via,
                                    signature=signature, seen=seen)
    else:
        checkpoint = engine.reject(pk, key, user=request.user, comment=comment, channel=via,
                                   signature=signature, seen=seen)
    verb = "approved" if action == "approve" else "rejected"
    return checkpoint, briefs.you_decided(verb, checkpoint.step.title,
                                          (checkpoint.evidence or {}).get("for", ""))


@require_POST
def step_action(request, pk: int, key: str, action: str):
    _require_readable(request, pk)
    run = pk  # the engine locks and reads it; a run that does not exist is a 404 from there
    comment = request.POST.get("comment", "").strip()
    try:
        if action in ("approve", "reject") and request.POST.get("sign_at_provider"):
            # Signed by signing in again at the company's provider: the decision waits in
            # the session and is made when the person comes back (sign_complete).
            target = signing.await_sign_on(request, pk, key, action)
            if request.htmx:
                return HttpResponse(headers={"HX-Redirect": target})
            return redirect(target)
        if action in ("approve", "reject"):
            checkpoint, done = decide(request, pk, key, action, request.POST,
                                      signing.signature_from(request, pk, key, action))
        elif action == "retry":
            checkpoint = engine.retry_step(run, key, actor=request.user)
            done = f"{checkpoint.step.title}: retry requested."
        elif action == "skip":
            checkpoint = engine.skip_step(run, key, actor=request.user, reason=comment)
            done = f"{checkpoint.step.title} skipped."
        elif action == "reassign":
            checkpoint = engine.reassign_gate(
                run, key, actor=request.user, reason=comment,
                group=request.POST.get("group", ""), person=request.POST.get("person", ""),
                rule=request.POST.get("rule", ""))
            done = f"{checkpoint.step.title}: {checkpoint.summary}"
        else:
            return HttpResponse(status=404)
    except engine.WorkflowError as exc:
        return _respond(request, pk, key=key, error=exc)
    return _respond(request, pk, key=key, done=done, checkpoint=checkpoint)


@require_GET
def sign_confirm(request, binding: str):
    """What the person is about to sign by signing in again at the company's provider: the
    decision waiting under `binding`, said in full, and the one button that starts the
    round trip for it alone (a link to this page starts nothing)."""
    try:
        waiting = signing.waiting_decision(request, binding)
        _require_readable(request, waiting["run"])
        step = Step.objects.select_related("run").get(run_id=waiting["run"], key=waiting["key"])
    except (engine.WorkflowError, Step.DoesNotExist) as exc:
        messages.error(request, str(exc) if isinstance(exc, engine.WorkflowError)
                       else "That gate no longer exists: nothing was decided.")
        return redirect("inbox")
    gates_seen.seen_by(request.user, [step], brief=False, audience=False)
    fields = waiting["fields"]
    return render(request, "workflows/sign_confirm.html", {
        "binding": binding, "step": step, "run": step.run, "decision": waiting["decision"],
        "comment": fields.get("comment", ""),
        "values": {name[6:]: value for name, value in fields.items()
                   if name.startswith("field_")},
        "meaning": engine.signature_meaning(step, step.deciding_rule, waiting["decision"]),
        "provider": settings.TOLLGATE_OIDC_LABEL})


@require_GET
def sign_complete(request):
    """Back from signing in again at the company's provider: the decision that waited for
    it is made, signed "sign-on", or refused saying why."""
    try:
        waiting, signature = signing.signed_on(request)
        _require_readable(request, waiting["run"])
        checkpoint, done = decide(request, waiting["run"], waiting["key"],
                                  waiting["decision"], waiting["fields"], signature)
    except engine.WorkflowError as exc:
        messages.error(request, str(exc))
        return redirect("inbox")
    messages.success(request, done)
    target = waiting["fields"].get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = checkpoint.run.get_absolute_url()
    return redirect(target)


@require_POST
def passkey_challenge(request, pk: int, key: str, action: str):
    """What a passkey is asked to sign for this decision's form (the form's own fields
    posted here first): WebAuthn request options, as JSON, or 400 saying why not."""
    _require_readable(request, pk)
    if action not in ("approve", "reject"):
        return HttpResponse(status=404)
    try:
        options = passkeys.signing_options(request, pk, key, action)
    except engine.WorkflowError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return HttpResponse(options, content_type="application/json")


@require_http_methods(["GET", "POST"])
def run_cancel(request, pk: int):
    run = get_object_or_404(readable_runs(request.user).select_related("spec"), pk=pk)
    if request.method == "GET":  # the confirmation page for browsers without JavaScript
        if not can_operate(request.user):
            raise PermissionDenied("Cancelling needs the operator permission.")
        children = Run.objects.filter(parent_step__run=run,
                                      status__in=OPEN_RUN_STATUSES).exists()
        return render(request, "workflows/run_cancel.html", {"run": run, "children": children})
    try:
        # The page asks why: it needs a why (once the engine would let this person cancel).
        if can_cancel(request.user, run) and not request.POST.get("reason", "").strip():
            raise engine.InvalidInput("Say why the run is cancelled: the reason goes on the "
                                      "timeline.")
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

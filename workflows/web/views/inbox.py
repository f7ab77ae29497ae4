"""The inbox: the gates waiting on you (live), deciding several at once, a mailed decision
link's page, and what you decided."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from tollgate.query import whole_number
from workflows import engine
from workflows.delivery import links
from workflows.models import Approval, Preference, Step, StepStatus
from workflows.reads import briefs
from workflows.timing import clock
from workflows.web import cards, polls
from workflows.web.forms import InboxView


def _view(request) -> tuple[InboxView, dict, str]:
    """The inbox's order and filters from its URL: (the form, its valid parts, them as a
    query string for the live poll and the links)."""
    form = InboxView(request.GET)
    form.is_valid()
    view = form.view()
    query = urlencode({name: getattr(value, "pk", value) for name, value in view.items()})
    return form, view, query


@require_GET
def inbox(request):
    if request.htmx and "poll" in request.GET:
        return _inbox_update(request)
    template = "workflows/inbox.html"
    if request.htmx:
        template += "#gates"
    form, view, query = _view(request)
    watching = polls.inbox_versions(request)  # before the rows
    choices = cards.inbox_choices(request.user)
    gates = cards.inbox_gates(request.user, view)
    ticked, digest_notice = _from_digest(request, gates)
    return render(request, template, {"live": watching, "away": _away(request.user),
                                      "gates": gates, "ticked": ticked,
                                      "digest_notice": digest_notice,
                                      "inbox_limit": cards.INBOX_LIMIT, "view_form": form,
                                      "view": view, "view_query": query, **choices})


def _from_digest(request, gates) -> tuple[set[int], str]:
    """The gates a digest's "approve together" link ticks (those of its list that still wait
    on this person and a press can decide), and what the page says of them. Ticking decides
    nothing: "Approve selected" does, with the evidence the cards show."""
    token = request.GET.get("digest", "")
    if not token:
        return set(), ""
    try:
        user_id, listed = links.read_digest(token)
    except links.BadLink as exc:
        return set(), str(exc)
    if user_id != request.user.pk:
        return set(), ("This digest's link was sent to someone else: nothing is ticked; the "
                       "gates that wait on you are below.")
    listed = set(listed)
    ticked = {gate.pk for gate in gates if gate.pk in listed
              and not gate.signing and not gate.config.get("approval", {}).get("form")}
    gone = len(listed - ticked)
    notice = (f"From your digest: {len(ticked)} gate{pluralize(len(ticked))} ticked below. "
              "Read them, then press “Approve selected” to approve them all.")
    if gone:
        notice += (f" {gone} of the digest's gates no longer wait{pluralize(gone, 's,')} "
                   "on you, or changed so that a press cannot decide them.")
    return ticked, notice


def _away(user):
    """The person's away period, if it holds now (with who stands in): one query."""
    now = clock.now()
    return (Preference.objects.select_related("delegate")
            .filter(user=user, away_from__lte=now, away_until__gt=now).first())


def _inbox_update(request):
    """What changed since the open inbox's last look, as out-of-band swaps around the cards
    it has (each sends "id:version"): new gates are added, changed quorum lines replaced,
    gates that no longer wait on this user turn into their decided state. A card a person
    is typing in is never replaced while it waits. Nothing changed is a 204: found from the
    page's versions (workflows.reads.live) when nothing it watches has rung, else from the gates'
    versions alone (no card is built for it)."""
    if polls.unchanged(request):
        return HttpResponse(status=204)
    watching = polls.inbox_versions(request)  # before the rows
    have = {}
    for item in request.GET.getlist("have")[:500]:
        pk, _, version = item.partition(":")
        if (gate_id := whole_number(pk)) is not None:
            have[gate_id] = version
    _, view, _ = _view(request)
    current = cards.inbox_versions(request.user, view)
    left_ids = [pk for pk in have if pk not in current]
    if not left_ids and all(have.get(pk) == version for pk, version in current.items()):
        return polls.with_versions(HttpResponse(status=204), watching)
    gates = cards.inbox_gates(request.user, view)
    arrived = [gate for gate in gates if gate.pk not in have]
    changed = [gate for gate in gates if gate.pk in have and have[gate.pk] != gate.version]
    left = cards.gates_left(request.user, left_ids)
    if not (arrived or changed or left):
        return polls.with_versions(HttpResponse(status=204), watching)
    return polls.with_versions(render(request, "workflows/inbox.html#inbox-update", {
        "gates": gates, "arrived": arrived, "changed": changed, "left": left}), watching)


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
            # Each ticked gate's card carries the evidence digest it was drawn with.
            decided, refused = engine.decide_many(
                picked, user=request.user, decision=request.POST.get("decision", ""),
                comment=request.POST.get("comment", ""),
                seen={pk: request.POST.get(f"seen-{pk}", "") for pk in picked})
            verb = "approved" if request.POST.get("decision") == "approve" else "rejected"
            done = [briefs.you_decided(verb, f"{gate.title} ({gate.run})", gate.decided_for)
                    for gate in decided]
        except engine.WorkflowError as exc:
            problem = str(exc)
    watching = polls.inbox_versions(request)  # before the rows
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
               "refused_cards": refused_cards, "live": watching}
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
    cards.seen_by(request.user, [gate])  # as its card shows it: who else, who was told
    if gate.refusal:
        problem = ("You have already decided this gate." if gate.decided_by_you
                   else gate.refusal)
        return render(request, "workflows/decide.html", {"run": gate.run,
                                                         "problem": problem}, status=403)
    # The mail showed the evidence as it stood then: say so when it has changed since.
    changed = bool(link.shown) and not gate.evidence_digest.startswith(link.shown)
    # Opened from a push notification's Approve or Reject: that choice made, one press left.
    via = "push" if request.GET.get("via") == "push" else "mail_link"
    choice = request.GET.get("choice", "") if via == "push" else ""
    return render(request, "workflows/decide.html", {
        "gate": gate, "changed": changed, "via": via,
        "choice": choice if choice in ("approve", "reject") else ""})


@require_GET
def my_decisions(request):
    """What the signed-in user approved or rejected, newest first."""
    decisions = (Approval.objects.filter(user=request.user)
                 .select_related("step", "step__run").order_by("-at", "-pk"))
    page = Paginator(decisions, 50).get_page(request.GET.get("page"))
    return render(request, "workflows/my_decisions.html", {"page": page})

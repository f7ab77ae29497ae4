"""For operators and managers: the workers, the deadlines, the decisions audit, and the
development mail page."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from tollgate.exports import csv_download
from workflows.audit import seals
from workflows.models import Notification
from workflows.ops import operations
from workflows.people.permissions import (
    can_export_audit,
    can_operate,
)
from workflows.reads import briefs, selectors
from workflows.recovery import presence


@require_GET
def workers(request):
    """Operators: every consumer seen, alive, gone or silent, what each holds; the periodic
    tasks' last runs; a warning when no sweep has run for three periods."""
    if not (can_operate(request.user) or request.user.is_staff):
        raise PermissionDenied("The workers page is for operators.")
    now = timezone.now()
    return render(request, "workflows/workers.html", {
        "workers": operations.workers(now), "periodic": operations.periodic_runs(),
        "sweeper_late": presence.sweeper_late(now), "window": "day"})


@require_GET
def dev_mail(request):
    """With DEBUG only: the mail Tollgate sent, newest first, links whole and clickable."""
    if not settings.DEBUG:
        raise Http404("The development mail page exists with DEBUG only.")
    mails = Notification.objects.select_related("user").order_by("-created_at")
    if not request.user.is_staff:  # each person their own mail; all of it to staff
        mails = mails.filter(user=request.user)
    return render(request, "workflows/dev_mail.html", {"mails": mails[:100]})


@require_GET
def gates_due(request):
    """For managers (staff and export_audit, as the audit): per group, how long the waiting
    gates have waited, and the gates overdue, due within a day, and escalated."""
    if not can_export_audit(request.user):
        raise PermissionDenied("The deadlines view is for managers (staff or the "
                                     "export_audit permission).")
    now = timezone.now()
    return render(request, "workflows/gates_due.html",
                  {"groups": briefs.due_gates(now), "waited": briefs.waiting_distribution(now)})


@require_GET
def audit(request):
    """Every decision in a date range, streamed as CSV (staff and managers)."""
    if not can_export_audit(request.user):
        raise PermissionDenied("Exporting the audit trail needs staff or the "
                                     "export_audit permission.")
    start = selectors.parse_day(request.GET.get("from", ""))
    end = selectors.parse_day(request.GET.get("to", ""))
    if request.GET.get("format") != "csv":
        return render(request, "workflows/audit.html", {
            "start": start, "end": end, "count": selectors.decisions(start, end).count()})
    rows = ([d[k] for k in selectors.DECISION_COLUMNS]
            for d in selectors.decision_rows(selectors.decisions(start, end)))
    return csv_download(rows, selectors.DECISION_COLUMNS, "tollgate-decisions.csv")


@login_not_required
@require_GET
def audit_key(request):
    """The public half of the key that seals the audit chains (PEM), for anyone checking
    an export: scripts/verify-audit-export --key."""
    pem = seals.public_pem()
    if not pem:
        return HttpResponse("No audit key yet: nothing has been sealed.\n", status=404,
                            content_type="text/plain; charset=utf-8")
    return HttpResponse(pem, content_type="text/plain; charset=utf-8")

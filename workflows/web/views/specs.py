"""The specs you may start, and the Start form."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from workflows import engine
from workflows.models import (
    WorkflowSpec,
)
from workflows.people import permissions
from workflows.reads import selectors
from workflows.web.forms import StartRunForm


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
        raise PermissionDenied("Starting runs needs the workflows.add_run permission; "
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

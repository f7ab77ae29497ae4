from django.shortcuts import render
from django.views.decorators.http import require_GET

from .selectors import waiting_gates_for


@require_GET
def inbox(request):
    gates = waiting_gates_for(request.user).select_related("run")
    return render(request, "workflows/inbox.html", {"gates": gates})

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse
from django.urls import include, path

from tollgate import api
from workflows.ops.metrics import scrape
from workflows.ops.operations import readiness

from .dbfaults import AWAY

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("workflows.sso.urls")),
    path("api/", api.urls()),
    path("goals/", include("goals.urls")),
    path("", include("workflows.web.urls")),
]
if settings.TOLLGATE_ANYMAIL_WEBHOOK_SECRET:  # replies through a hosted mail service
    urlpatterns.append(path("anymail/", include("anymail.urls")))


@login_not_required
def healthz(request):
    """Liveness for load balancers: answers without touching the database."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns.append(path("healthz", healthz, name="healthz"))


@login_not_required
def readyz(request):
    """Readiness for load balancers: 200 when the database and the queue answer, else 503
    naming what failed. (/healthz stays the cheap liveness check.)"""
    import json

    checks = readiness()
    ready = all(value == "ok" for value in checks.values())
    response = HttpResponse(json.dumps({"ready": ready, "checks": checks}),
                            content_type="application/json", status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = "5"
    return response


urlpatterns.append(path("readyz", readyz, name="readyz"))


@login_not_required
def metrics(request):
    """Prometheus text format, for a Bearer TOLLGATE_METRICS_TOKEN or the networks in
    TOLLGATE_METRICS_ALLOW (loopback by default)."""
    import hmac
    import ipaddress

    from django.conf import settings
    from prometheus_client import CONTENT_TYPE_LATEST

    token = settings.TOLLGATE_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        allowed = hmac.compare_digest(given.encode(), token.encode())
    else:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
            allowed = any(address in ipaddress.ip_network(net, strict=False)
                          for net in settings.TOLLGATE_METRICS_ALLOW)
        except ValueError:
            allowed = False
    if not allowed:
        return HttpResponse("Metrics need the metrics token or an allowed address.",
                            content_type="text/plain", status=403)
    return HttpResponse(scrape(), content_type=CONTENT_TYPE_LATEST)


urlpatterns.append(path("metrics", metrics, name="metrics"))


@login_not_required
def favicon(request):
    """Browsers ask for /favicon.ico on every site: the icon, not a 404."""
    from django.shortcuts import redirect
    from django.templatetags.static import static

    return redirect(static("tollgate/favicon.svg"), permanent=True)


urlpatterns.append(path("favicon.ico", favicon))


def server_error(request):
    """A 500 that is the database being away (restarting, cut off, out of connections) is
    a 503 with Retry-After: the person, or the htmx press, may simply try again."""
    import sys

    from django.db import IntegrityError
    from django.views.defaults import server_error as plain

    if isinstance(sys.exc_info()[1], AWAY):
        from django.db import connection

        connection.close_if_unusable_or_obsolete()
        response = HttpResponse("The database is not answering; try again in a few seconds.",
                                content_type="text/plain", status=503)
        response["Retry-After"] = "5"
        return response
    if isinstance(sys.exc_info()[1], IntegrityError):
        return HttpResponse("This conflicts with a change made at the same time; nothing was "
                            "changed. Reload the page and try again.",
                            content_type="text/plain", status=409)
    return plain(request)


handler500 = server_error

"""Tollgate's pages, and `bench/write/`: the least any approve must do, to measure approve
against. A signed-in person's POST through every middleware Tollgate runs (session, user,
CSRF, htmx), one transaction of one UPDATE and one INSERT (the floor's write at Tollgate's
durability), and a short answer: no engine, no template, no page versions."""

from django.db import connection, transaction
from django.http import HttpResponse
from django.urls import include, path
from django.views.decorators.http import require_POST


@require_POST
def write(request):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE bench_row SET n = n + 1 WHERE id = 1")
        cursor.execute("INSERT INTO bench_log (id, seq, note) VALUES (%s, %s, %s)",
                       [request.user.pk, 0, "approve floor"])
    return HttpResponse("<p>decided</p>")


urlpatterns = [path("bench/write/", write), path("", include("tollgate.urls"))]

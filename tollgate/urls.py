from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse
from django.urls import include, path

from tollgate import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", api.urls()),
    path("goals/", include("goals.urls")),
    path("", include("workflows.urls")),
]


@login_not_required
def healthz(request):
    """Liveness for load balancers: answers without touching the database."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns.append(path("healthz", healthz, name="healthz"))

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from workflows import api as workflows_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", workflows_api.urls()),
    path("goals/", include("goals.urls")),
    path("", include("workflows.urls")),
]

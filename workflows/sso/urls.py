from django.urls import path

from . import views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.sign_out, name="logout"),
    path("sso/login/", views.sign_in, name="sso_login"),
    path("sso/callback/", views.callback, name="sso_callback"),
    path("sso/sign/", views.sign, name="sso_sign"),
]

from django.urls import path

from workflows.web import views

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("inbox/decide/", views.inbox_bulk, name="inbox_bulk"),
    path("runs/", views.run_list, name="run_list"),
    path("decisions/", views.my_decisions, name="my_decisions"),
    path("decide/<str:token>/", views.decide, name="decide"),
    path("profile/", views.profile, name="profile"),
    path("specs/", views.spec_list, name="spec_list"),
    path("specs/<slug:name>/start/", views.start_run, name="start_run"),
    path("profile/tokens/<int:pk>/revoke/", views.token_revoke, name="token_revoke"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/recover/", views.run_recover, name="run_recover"),
    path("runs/<int:pk>/audit/", views.run_audit, name="run_audit"),
    path("audit/", views.audit, name="audit"),
    path("gates/due/", views.gates_due, name="gates_due"),
    path("dev/mail/", views.dev_mail, name="dev_mail"),
    path("workers/", views.workers, name="workers"),
    path("runs/<int:pk>/steps/<str:key>/<str:action>/", views.step_action, name="step_action"),
]

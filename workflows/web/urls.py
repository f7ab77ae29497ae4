from django.urls import path

from workflows.web.views import account, chat, inbox, oversight, runs, specs

urlpatterns = [
    path("", inbox.inbox, name="inbox"),
    path("inbox/decide/", inbox.inbox_bulk, name="inbox_bulk"),
    path("runs/", runs.run_list, name="run_list"),
    path("decisions/", inbox.my_decisions, name="my_decisions"),
    path("decide/<str:token>/", inbox.decide, name="decide"),
    path("profile/", account.profile, name="profile"),
    path("specs/", specs.spec_list, name="spec_list"),
    path("specs/<slug:name>/start/", specs.start_run, name="start_run"),
    path("profile/tokens/<int:pk>/revoke/", account.token_revoke, name="token_revoke"),
    path("profile/passkeys/", account.passkey_add, name="passkey_add"),
    path("profile/passkeys/options/", account.passkey_options, name="passkey_options"),
    path("profile/passkeys/<int:pk>/remove/", account.passkey_remove, name="passkey_remove"),
    path("runs/<int:pk>/", runs.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/recover/", runs.run_recover, name="run_recover"),
    path("runs/<int:pk>/audit/", runs.run_audit, name="run_audit"),
    path("audit/", oversight.audit, name="audit"),
    path("audit/key", oversight.audit_key, name="audit_key"),
    path("gates/due/", oversight.gates_due, name="gates_due"),
    path("dev/mail/", oversight.dev_mail, name="dev_mail"),
    path("workers/", oversight.workers, name="workers"),
    path("runs/<int:pk>/steps/<str:key>/<str:action>/", runs.step_action, name="step_action"),
    path("runs/<int:pk>/steps/<str:key>/<str:action>/passkey/", runs.passkey_challenge,
         name="passkey_challenge"),
    path("sign/complete/", runs.sign_complete, name="sign_complete"),
    path("chat/slack/interactions/", chat.slack_interactions, name="slack_interactions"),
    path("chat/teams/messages/", chat.teams_messages, name="teams_messages"),
    path("chat/link/<str:token>/", chat.chat_link, name="chat_link"),
]

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # checks registers itself; tasks binds the queue's tasks to dispatch, in web
        # processes as in consumers.
        from workflows import goal_closing, tasks, timezones  # noqa: F401
        from workflows.delivery import dispatch, outbox
        from workflows.engine import transition_committed, transition_recording
        from workflows.ops import checks, metrics  # noqa: F401
        from workflows.sso import middleware as sso_sessions

        transition_recording.connect(outbox.record, dispatch_uid="tollgate-outbox")
        transition_committed.connect(dispatch.on_transition, dispatch_uid="tollgate-dispatch")
        transition_committed.connect(metrics.on_transition, dispatch_uid="tollgate-metrics")
        # Connected here, not on import, so a login before the first request (a script, a
        # test client) still stamps the session.
        user_logged_in.connect(sso_sessions.note_sign_in, dispatch_uid="tollgate-signed-in-at")
        from django.conf import settings

        if settings.TOLLGATE_OTEL:
            from tollgate import tracing

            tracing.setup()

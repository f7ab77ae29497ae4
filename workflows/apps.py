from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in, user_logged_out


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # checks registers itself; tasks binds the queue's tasks to dispatch, in web
        # processes as in consumers.
        from workflows import tasks  # noqa: F401
        from workflows.delivery import dispatch, outbox
        from workflows.engine import (
            goal_closing,  # noqa: F401
            transition_committed,
            transition_recording,
        )
        from workflows.ops import checks, metrics  # noqa: F401
        from workflows.sso import middleware as sso_sessions
        from workflows.timing import timezones  # noqa: F401

        transition_recording.connect(outbox.record, dispatch_uid="tollgate-outbox")
        transition_committed.connect(dispatch.on_transition, dispatch_uid="tollgate-dispatch")
        transition_committed.connect(metrics.on_transition, dispatch_uid="tollgate-metrics")
        self.connect_live()
        # Connected here, not on import, so a login before the first request (a script, a
        # test client) still stamps the session.
        user_logged_in.connect(sso_sessions.note_sign_in, dispatch_uid="tollgate-signed-in-at")
        from django.conf import settings

        if settings.TOLLGATE_ANYMAIL_WEBHOOK_SECRET:
            from anymail.signals import inbound

            from workflows.inbound import hosted

            inbound.connect(hosted.on_inbound, dispatch_uid="tollgate-mail-replies")
        if settings.TOLLGATE_OTEL:
            from tollgate import tracing

            tracing.setup()

    def connect_live(self) -> None:
        """Open pages learn of changes from workflows.reads.live's versions."""
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed, post_delete, post_save

        from workflows.engine import transition_recording
        from workflows.models import Preference
        from workflows.reads import live

        transition_recording.connect(live.on_transition, dispatch_uid="tollgate-live")
        user_logged_out.connect(live.end_session, dispatch_uid="tollgate-live-session")
        m2m_changed.connect(live.on_groups_changed, sender=get_user_model().groups.through,
                            dispatch_uid="tollgate-live-groups")
        for signal in (post_save, post_delete):
            signal.connect(live.on_preference_changed, sender=Preference,
                           dispatch_uid=f"tollgate-live-preference-{signal is post_save}")

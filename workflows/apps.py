from django.apps import AppConfig


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

        transition_recording.connect(outbox.record, dispatch_uid="tollgate-outbox")
        transition_committed.connect(dispatch.on_transition, dispatch_uid="tollgate-dispatch")
        transition_committed.connect(metrics.on_transition, dispatch_uid="tollgate-metrics")
        from django.conf import settings

        if settings.TOLLGATE_OTEL:
            from tollgate import tracing

            tracing.setup()

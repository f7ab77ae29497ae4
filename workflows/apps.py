from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, dispatch  # noqa: F401 (checks registers itself)
        from .engine import transition_committed

        transition_committed.connect(dispatch.on_transition, dispatch_uid="tollgate-dispatch")

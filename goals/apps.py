from django.apps import AppConfig


class GoalsConfig(AppConfig):
    name = "goals"
    default_auto_field = "django.db.models.BigAutoField"

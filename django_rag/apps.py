from django.apps import AppConfig


class DjangoRagConfig(AppConfig):
    name = "django_rag"
    label = "django_rag"
    verbose_name = "RAG"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            tasks,  # noqa: F401  (registers the background tasks)
        )
        from .telemetry import setup

        setup()

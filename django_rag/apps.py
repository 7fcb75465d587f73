import logging
import os
import sys
from pathlib import Path

from django.apps import AppConfig

logger = logging.getLogger("django_rag")

# Programs that serve requests through a management command (the rest only run a task).
SERVING_COMMANDS = {"runserver", "runserver_plus", "daphne", "uvicorn"}


def management_command(argv: list[str]) -> str | None:
    """The command a ``manage.py`` / ``django-admin`` / ``python -m django`` process runs, or
    None when the process is something else (a WSGI/ASGI server, Celery, a script)."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program in ("manage.py", "django-admin", "django-admin.py") or argv[0].endswith(
        os.path.join("django", "__main__.py")
    ):
        return argv[1] if len(argv) > 1 else "help"
    return None


def is_celery(argv: list[str]) -> bool:
    return bool(argv) and (
        os.path.basename(argv[0]) == "celery"
        or argv[0].endswith(os.path.join("celery", "__main__.py"))
    )


def preloads_here(argv: list[str], environ=os.environ) -> bool:
    """Whether this process preloads models in ``ready()`` (when ``PRELOAD_MODELS`` is on):
    a WSGI/ASGI server process or ``runserver``'s serving child, not the autoreloader's parent,
    not other management commands, not Celery (its worker processes preload themselves)."""
    if is_celery(argv) or _is_pytest(argv):
        return False
    command = management_command(argv)
    if command is None:
        return True
    if command not in SERVING_COMMANDS:
        return False
    # With the autoreloader, the parent only watches files; the child has RUN_MAIN set.
    return environ.get("RUN_MAIN") == "true" or "--noreload" in argv


def _is_pytest(argv: list[str]) -> bool:
    """A test run (``pytest`` or ``python -m pytest``): tests load the models they use."""
    if not argv:
        return False
    path = Path(argv[0])
    return path.name.startswith(("pytest", "py.test")) or path.parent.name == "pytest"


def preload() -> None:
    """Load the configured models, logging (not raising) a failure: the web process still
    starts, and the first search reports the error where it can be seen."""
    from .maintenance import preload_models

    try:
        names = preload_models()
    except Exception:
        logger.exception("django_rag: preloading models failed (PRELOAD_MODELS)")
        return
    if names:
        logger.info("django_rag: preloaded %s", ", ".join(names))


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
        from .conf import get_setting
        from .retrieval import stores  # noqa: F401  (registers the "memory" store alias)
        from .telemetry import setup

        setup()
        if get_setting("PRELOAD_MODELS") and preloads_here(sys.argv):
            preload()

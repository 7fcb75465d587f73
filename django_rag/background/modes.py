"""The background modes: which runner takes work now (``DJANGO_RAG["BACKGROUND"]``, ``"auto"``
resolved) and a sentence about it for people.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..conf import background_setting, jobs_setting
from ..exceptions import ConfigurationError, MissingDependency

CELERY, THREAD, WORKER, INLINE = "celery", "thread", "worker", "inline"


def _celery_configured() -> bool:
    if importlib.util.find_spec("celery") is None:
        return False
    from celery import current_app

    return bool(current_app.conf.broker_url) and not current_app.conf.task_always_eager


def mode() -> str:
    """The mode work is queued in now: ``"celery"``, ``"thread"``, ``"worker"`` or
    ``"inline"`` (``"auto"`` resolved)."""
    setting = background_setting()
    if setting == "auto":
        return CELERY if _celery_configured() else THREAD
    if setting == CELERY:
        if importlib.util.find_spec("celery") is None:
            raise MissingDependency("celery", "celery", "Background work on Celery")
        if not _celery_configured():
            raise ConfigurationError(
                "BACKGROUND", setting, "the Celery app has no broker_url (or runs eagerly)"
            )
    return setting


def use_celery() -> bool:
    return mode() == CELERY


DESCRIPTIONS = {
    CELERY: "Celery workers (the host project's broker)",
    THREAD: "a thread pool in this process ({threads} thread{s}); jobs of a process that "
    "stops are shown as stalled",
    WORKER: "rag_worker processes (manage.py rag_worker) claiming jobs from the database",
    INLINE: "inline: the caller waits while the work runs",
}


def describe() -> dict[str, Any]:
    """The active mode, the setting it comes from and a sentence for people (dashboard,
    ``rag_info``)."""
    setting = background_setting()
    try:
        active = mode()
    except (ConfigurationError, MissingDependency) as exc:
        return {"setting": setting, "mode": None, "description": str(exc)}
    threads = jobs_setting("THREADS")
    return {
        "setting": setting,
        "mode": active,
        "description": DESCRIPTIONS[active].format(threads=threads, s="" if threads == 1 else "s"),
        "stalled_after_seconds": jobs_setting("STALLED_AFTER_SECONDS"),
        # A job whose process on this machine has exited is stalled once its heartbeat is
        # this late (django_rag.background.stalled.runner_gone).
        "gone_after_seconds": round(1.5 * jobs_setting("HEARTBEAT_SECONDS"), 1),
    }

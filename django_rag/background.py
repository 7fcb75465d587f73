"""Run long work on Celery workers, or inline when no broker is configured.

``DJANGO_RAG["BACKGROUND"]``: ``"auto"`` (Celery when the host project's Celery app has a
broker URL and is not in eager mode, else inline), ``"celery"`` or ``"inline"``. Inline runs
the same task body synchronously, so the embedded default works with no services.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from django.db import transaction

from .conf import get_setting, scrub_text
from .exceptions import BackgroundUnavailable, ConfigurationError, MissingDependency
from .models import Job


def use_celery() -> bool:
    mode = get_setting("BACKGROUND")
    if mode == "inline":
        return False
    if mode not in ("auto", "celery"):
        raise ConfigurationError("BACKGROUND", mode, "use 'auto', 'celery' or 'inline'")
    if importlib.util.find_spec("celery") is None:
        if mode == "celery":
            raise MissingDependency("celery", "celery", "Background work on Celery")
        return False
    from celery import current_app

    configured = bool(current_app.conf.broker_url) and not current_app.conf.task_always_eager
    if mode == "celery" and not configured:
        raise ConfigurationError(
            "BACKGROUND", mode, "the Celery app has no broker_url (or runs eagerly)"
        )
    return configured


# Task name -> task (a Celery task, or the plain function without Celery). Filled by
# django_rag.tasks as it is imported (the app config imports it when Django starts), so this
# module, which every layer may use to queue work, never imports the tasks themselves.
_TASKS: dict[str, Callable[..., Any]] = {}


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make ``task`` runnable by ``enqueue(name, job)``."""

    def decorate(task: Callable[..., Any]) -> Callable[..., Any]:
        _TASKS[name] = task
        return task

    return decorate


def enqueue(
    task_name: str, job: Job, *, on_failure: Callable[[], Any] | None = None, **kwargs: Any
) -> Job:
    """Run the task ``task_name`` (``task(job_id=job.pk, **kwargs)``) on a worker, or inline.

    When the task cannot be sent, the job is marked failed, ``on_failure`` runs (to remove
    what was waiting for the task) and :class:`BackgroundUnavailable` is raised.
    """
    task = _TASKS[task_name]
    if use_celery():

        def send() -> None:
            try:
                result = task.apply_async(kwargs={"job_id": job.pk, **kwargs})
            except Exception as exc:  # kombu's OperationalError, a refused connection...
                job.fail(exc)
                if on_failure is not None:
                    on_failure()
                raise BackgroundUnavailable(
                    f"The task could not be sent to the Celery broker ({type(exc).__name__}: "
                    f"{scrub_text(exc)}). Start the broker, or set DJANGO_RAG['BACKGROUND'] = 'inline' to "
                    "run background work in the calling process."
                ) from exc
            Job.objects.filter(pk=job.pk).update(task_id=result.id)
            job.task_id = result.id

        # Inside a transaction (ATOMIC_REQUESTS, a caller's atomic block) the worker must not
        # look for rows that are not committed yet: send when the transaction commits (outside
        # one, at once, so a broker failure reaches the caller as BackgroundUnavailable).
        transaction.on_commit(send)
        return job
    task(job_id=job.pk, **kwargs)
    job.refresh_from_db()
    return job


def start(task_name: str, **params: Any) -> Job:
    """Create a job for ``django_rag.tasks.<task_name>`` with ``params`` and queue it."""
    job = Job.objects.create(kind=Job.Kind(task_name.replace("_", "-")), params=params)
    return enqueue(task_name, job)


def enqueue_reembed(**params: Any) -> Job:
    """Queue :func:`django_rag.maintenance.reembed` with ``params``; returns its Job."""
    job = Job.objects.create(kind=Job.Kind.REEMBED_TASK, params={"options": params})
    return enqueue("reembed", job)

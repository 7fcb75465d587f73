"""Automatic retries: which failures are transient, the backoff, and queueing a job again after
one (the thread pool and rag_worker; Celery retries with the same figures, in django_rag.tasks).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import InterfaceError, OperationalError, router
from django.utils import timezone

from ..conf import scrub_text
from ..exceptions import EmbeddingFailed, LLMError
from ..models import Job
from ..models.databases import on_live_connection

logger = logging.getLogger("django_rag.background")


# Worth another attempt: provider hiccups and lost database connections. Celery retries them
# (django_rag.tasks), and so do rag_worker and the thread pool, with the same backoff.
TRANSIENT = (EmbeddingFailed, LLMError, OperationalError, InterfaceError)


MAX_RETRIES = 5


BACKOFF_MAX_SECONDS = 60


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1``: 1, 2, 4... up to a minute."""
    return float(min(2 ** max(attempt - 1, 0), BACKOFF_MAX_SECONDS))


def queue_again_later(job_id: int, exc: BaseException, runner: str) -> float | None:
    """After a transient failure (recorded on the job by the task), queue the job again with
    backoff while attempts are left: back to pending, not before ``backoff(attempts)`` seconds.
    Returns the delay, or None when the job stays failed."""
    logger.warning("Job %s failed (%s: %s)", job_id, type(exc).__name__, scrub_text(exc))
    db = router.db_for_write(Job)

    def requeue() -> float | None:
        job = Job.objects.using(db).filter(pk=job_id, status=Job.Status.FAILED).first()
        if job is None or job.attempts > MAX_RETRIES:
            return None
        delay = backoff(job.attempts)
        queued = (
            Job.objects.using(db)
            .filter(pk=job_id, status=Job.Status.FAILED)
            .update(
                status=Job.Status.PENDING,
                runner=runner,
                worker="",
                finished_at=None,
                not_before=timezone.now() + timedelta(seconds=delay),
                heartbeat_at=timezone.now(),
            )
        )
        return delay if queued else None

    delay = on_live_connection(db, requeue)
    if delay is not None:
        logger.info("Job %s queued again in %.0f s (transient failure)", job_id, delay)
    return delay

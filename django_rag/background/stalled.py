"""Stalled jobs (pending or running with no heartbeat: their runner died) and retrying failed or
stalled jobs by hand (the dashboard, ``rag_jobs``).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import router
from django.db.models import Q, QuerySet
from django.utils import timezone

from ..conf import jobs_setting
from ..exceptions import JobNotRetryable
from ..models import Document, Job
from .modes import mode
from .registry import task_for
from .runners import enqueue

logger = logging.getLogger("django_rag.background")


def _stalled_q() -> Q:
    cutoff = timezone.now() - timedelta(seconds=jobs_setting("STALLED_AFTER_SECONDS"))
    return Q(status__in=[Job.Status.PENDING, Job.Status.RUNNING]) & (
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    )


def _cannot_run_again(job: Job) -> str:
    """Why running ``job`` again could not work ("" when it could)."""
    if job.status == Job.Status.SUPERSEDED:
        return "it was superseded (a newer version of its document was written first)"
    if job.kind == Job.Kind.INGEST:
        document_id = job.params.get("document_id")
        if not Document.objects.using(router.db_for_write(Job)).filter(pk=document_id).exists():
            return "its document was deleted or replaced by a newer version"
    return ""


def why_not_retryable(job: Job) -> str:
    """Why a retry of ``job`` could not work whatever its status ("" when it could): it was
    superseded, or its document is gone (the dashboard shows it instead of a Retry button)."""
    return _cannot_run_again(job)


def retryable(job: Job, *, stalled_after: float | None = None) -> bool:
    """Whether :func:`retry` would queue ``job`` again (what the dashboard offers)."""
    after = jobs_setting("STALLED_AFTER_SECONDS") if stalled_after is None else stalled_after
    return (
        (job.status == Job.Status.FAILED or job.is_stalled(after))
        and task_for(job) is not None
        and not _cannot_run_again(job)
    )


def stalled(queryset: QuerySet[Job] | None = None) -> QuerySet[Job]:
    """Jobs pending or running with no heartbeat for ``JOBS["STALLED_AFTER_SECONDS"]``: their
    worker died (or nothing picked them up)."""
    return (Job.objects.all() if queryset is None else queryset).filter(_stalled_q())


def retry(job: Job, *, runner: str | None = None) -> Job:
    """Queue a failed or stalled job again (in the active mode, or ``runner``).

    Idempotent: the job moves back to pending in one conditional update, so two retries at once
    queue it once; a task finds a completed job and leaves it alone, and the write path
    replaces a document's earlier attempt. Raises :class:`JobNotRetryable` otherwise.
    """
    task_name = task_for(job)
    if task_name is None:
        raise JobNotRetryable(
            f"Job {job.pk} ({job.kind}) was run by a command, not queued: run the command "
            "again (rag_reembed --resume continues a re-embed)."
        )
    why_not = _cannot_run_again(job)
    if why_not:
        raise JobNotRetryable(f"Job {job.pk} cannot be retried: {why_not}.")
    runner = runner or mode()
    requeued = (
        Job.objects.filter(pk=job.pk)
        .filter(Q(status=Job.Status.FAILED) | _stalled_q())
        .update(
            status=Job.Status.PENDING,
            error="",
            finished_at=None,
            worker="",
            runner=runner,
            # "Queued again at": not stalled again before another STALLED_AFTER_SECONDS.
            heartbeat_at=timezone.now(),
            not_before=None,  # asked for now: not after an automatic retry's backoff
        )
    )
    if not requeued:
        raise JobNotRetryable(
            f"Job {job.pk} is {job.get_status_display().lower()} and not stalled: nothing to retry."
        )
    job.refresh_from_db()
    logger.info("Job %s (%s) queued again (%s)", job.pk, job.kind, runner)
    return enqueue(task_name, job, runner=runner)

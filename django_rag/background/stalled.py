"""Stalled jobs (pending or running with no heartbeat: their runner died) and retrying failed or
stalled jobs by hand (the dashboard, ``rag_jobs``).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from django.db import router
from django.db.models import Q, QuerySet
from django.utils import timezone

from ..conf import jobs_setting
from ..exceptions import JobNotRetryable
from ..models import Document, Job
from .modes import describe, mode
from .registry import process_alive, process_on_this_host, task_for
from .runners import enqueue

logger = logging.getLogger("django_rag.background")


def _stalled_q(*, after: float | None = None) -> Q:
    after = jobs_setting("STALLED_AFTER_SECONDS") if after is None else after
    cutoff = timezone.now() - timedelta(seconds=after)
    silent = Q(status__in=[Job.Status.PENDING, Job.Status.RUNNING]) & (
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    )
    gone = _gone_here()
    return silent | Q(pk__in=gone) if gone else silent


def _late(job: Job) -> bool:
    """Whether ``job``'s heartbeat is late: older than one ``HEARTBEAT_SECONDS`` and a half. A
    live runner beats more often than that wherever it runs (a machine of another container
    may share this one's host name, never its processes)."""
    last = job.heartbeat_at or job.started_at or job.created_at
    return (timezone.now() - last).total_seconds() > describe()["gone_after_seconds"]


def runner_gone(job: Job) -> bool:
    """Whether ``job`` is running in a process of this machine that has exited (killed,
    crashed) and its heartbeat is late: stalled at once, without waiting
    ``STALLED_AFTER_SECONDS``. False wherever that cannot be known (another machine)."""
    if job.status != Job.Status.RUNNING:
        return False
    pid = process_on_this_host(job.worker)
    return pid is not None and pid != os.getpid() and _late(job) and not process_alive(pid)


def _gone_here() -> list[int]:
    """The running jobs :func:`runner_gone` finds (one query over the running jobs of this
    machine: a handful)."""
    host = socket.gethostname()
    running = Job.objects.filter(status=Job.Status.RUNNING, worker__startswith=f"{host}:")
    return [
        job.pk
        for job in running.only(
            "pk", "status", "worker", "heartbeat_at", "started_at", "created_at"
        )
        if runner_gone(job)
    ]


def is_stalled(job: Job, *, stalled_after: float | None = None) -> bool:
    """Whether ``job`` is stalled: no heartbeat for ``JOBS["STALLED_AFTER_SECONDS"]`` (or
    ``stalled_after``), or its process on this machine is gone (:func:`runner_gone`)."""
    after = jobs_setting("STALLED_AFTER_SECONDS") if stalled_after is None else stalled_after
    return job.is_stalled(after) or runner_gone(job)


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
    return (
        (job.status == Job.Status.FAILED or is_stalled(job, stalled_after=stalled_after))
        and task_for(job) is not None
        and not _cannot_run_again(job)
    )


def stalled(queryset: QuerySet[Job] | None = None) -> QuerySet[Job]:
    """Jobs pending or running with no heartbeat for ``JOBS["STALLED_AFTER_SECONDS"]`` (their
    worker died, or nothing picked them up), and running jobs whose process on this machine is
    gone (:func:`runner_gone`)."""
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

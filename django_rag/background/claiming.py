"""Taking a job: one conditional update decides which runner runs a job (a job queued twice runs
once at a time), and this process counts the jobs its threads run now.
"""

from __future__ import annotations

import contextvars
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import router
from django.db.models import Q
from django.utils import timezone

from ..conf import jobs_setting
from ..models import Job
from ..models.databases import on_live_connection
from .registry import process_name, worker_name

# The job a rag_worker claimed and is running in this context.
claimed_job: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "django_rag_claimed_job", default=None
)


# Jobs whose task runs in this process now (any thread), by id. take() refuses these (a job
# queued twice here runs once at a time) and only these: a job the table says runs in this
# process but that no thread here runs is an orphan (its run ended without recording how,
# because the database was unreachable even for the failure), and a retry takes it.
_running_here: Counter[int] = Counter()


_running_lock = threading.Lock()


@contextmanager
def taken(job_id: int) -> Iterator[bool]:
    """Take the job (:func:`take`) and count it as running in this process until the block
    ends; yields whether it was taken (a task body runs only then)."""
    busy = hold_job(job_id)
    try:
        yield take(job_id, busy_here=busy)
    finally:
        release_job(job_id)


def hold_job(job_id: int) -> bool:
    """Count ``job_id`` as running in this process; returns whether it already was."""
    with _running_lock:
        busy = _running_here[job_id] > 0
        _running_here[job_id] += 1
    return busy


def release_job(job_id: int) -> None:
    with _running_lock:
        _running_here[job_id] -= 1
        if _running_here[job_id] <= 0:
            del _running_here[job_id]


def running_here(job_id: int) -> bool:
    """Whether a thread of this process runs ``job_id``'s task now."""
    with _running_lock:
        return _running_here[job_id] > 0


def take(job_id: int, *, busy_here: bool = False) -> bool:
    """Take a job for the runner about to run it, in one conditional update. Pending, failed (a
    Celery retry) and stalled jobs are taken, and so is a job running in another process (a
    message Celery delivers again after its worker died) or marked running by this process
    when no thread of it runs the job (``busy_here`` false: its run ended without recording
    how). A job another thread of this process runs now (``busy_here``) with a live heartbeat
    is not: a job queued twice here (a retry of a job still waiting for a pool thread) runs
    once at a time. Neither is a completed or superseded job. The caller leaves a job it
    could not take alone."""
    if claimed_job.get() == job_id:
        return True
    running = Q(status=Job.Status.RUNNING)
    if busy_here:
        cutoff = timezone.now() - timedelta(seconds=jobs_setting("STALLED_AFTER_SECONDS"))
        here = process_name()
        in_this_process = Q(worker=here) | Q(worker__startswith=f"{here}:")
        running &= Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True) | ~in_this_process
    takeable = Q(status__in=[Job.Status.PENDING, Job.Status.FAILED]) | running
    db = router.db_for_write(Job)
    # The first statement of a task: a connection that died while the worker waited for work
    # is replaced here (running it twice is harmless: the job is then running here).
    return bool(
        on_live_connection(
            db,
            lambda: (
                Job.objects.using(db)
                .filter(takeable, pk=job_id)
                .update(
                    status=Job.Status.RUNNING, heartbeat_at=timezone.now(), worker=worker_name()
                )
            ),
        )
    )

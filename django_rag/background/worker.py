"""rag_worker: claim jobs queued for it (``FOR UPDATE SKIP LOCKED``), run them, and recover the
jobs of worker processes of this host that died.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    router,
    transaction,
)
from django.db.models import Q
from django.utils import timezone

from ..conf import jobs_setting
from ..exceptions import JobNotRetryable
from ..models import Job
from .claiming import claimed_job, hold_job, release_job, running_here
from .modes import WORKER
from .registry import TASKS, abandon, process_alive, task_for, worker_name
from .transient import TRANSIENT, queue_again_later

logger = logging.getLogger("django_rag.background")


def recover_orphaned(*, this_process_only: bool = False) -> list[int]:
    """Jobs marked running by a process of this host that no longer exists (killed, crashed,
    the machine rebooted), or by this process when no thread of it runs them (their failure
    could not be recorded: the database was unreachable): failed with why, their document
    too, and queued again for rag_worker when they were queued for it (else left failed for
    a retry). rag_worker runs it when it starts, so such a job does not wait
    ``STALLED_AFTER_SECONDS`` to be noticed, and with ``this_process_only`` whenever it finds
    no work (other processes are checked only at start: a process id is checked on this
    machine, and containers that share a host name do not share process ids). Returns the
    ids recovered."""
    host = socket.gethostname()
    recovered = []
    for job in Job.objects.filter(status=Job.Status.RUNNING, worker__startswith=f"{host}:"):
        pid = job.worker.split(":")[1]
        if not pid.isdigit():
            continue
        if int(pid) == os.getpid():
            if running_here(job.pk) or claimed_job.get() == job.pk:
                continue
            why = "its run in this process ended without recording how (the database was lost)"
        elif this_process_only or process_alive(int(pid)):
            continue
        else:
            why = f"its worker process ({job.worker}) is gone"
        abandon(job, RuntimeError(why))
        if job.runner == WORKER:
            Job.objects.filter(pk=job.pk, status=Job.Status.FAILED).update(
                status=Job.Status.PENDING,
                worker="",
                finished_at=None,
                heartbeat_at=timezone.now(),
                not_before=None,
            )
        logger.warning("Job %s: %s; recovered", job.pk, why)
        recovered.append(job.pk)
    return recovered


def claim(worker: str | None = None) -> Job | None:
    """Take the oldest job queued for rag_worker, or None. ``SKIP LOCKED``: concurrent workers
    never wait for each other and never take the same job. Pass the job to :func:`run`."""
    db = router.db_for_write(Job)
    with transaction.atomic(using=db):
        job = (
            Job.objects.using(db)
            .select_for_update(skip_locked=True)
            .filter(runner=WORKER, status=Job.Status.PENDING)
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=timezone.now()))
            .order_by("created_at", "pk")
            .first()
        )
        if job is None:
            return None
        job.status, job.worker, job.heartbeat_at = (
            Job.Status.RUNNING,
            worker or worker_name(),
            timezone.now(),
        )
        # Running here from the moment another thread could see it running (recover_orphaned
        # must not take it for an orphan before run() starts it); run() lets go.
        hold_job(job.pk)
        try:
            job.save(update_fields=["status", "worker", "heartbeat_at"])
        except BaseException:
            release_job(job.pk)
            raise
    return job


def _next_retry_in() -> float | None:
    """Seconds until the next job queued for rag_worker is due after its backoff, or None when
    none waits."""
    try:
        due = (
            Job.objects.using(router.db_for_write(Job))
            .filter(runner=WORKER, status=Job.Status.PENDING, not_before__isnull=False)
            .order_by("not_before")
            .values_list("not_before", flat=True)
            .first()
        )
    except (OperationalError, InterfaceError):
        return jobs_setting("POLL_SECONDS")  # unknown: look again after a poll
    return None if due is None else (due - timezone.now()).total_seconds()


def run(job: Job) -> None:
    """Run a claimed job's task; a failure is recorded on the job and logged, never raised."""
    try:
        _run_claimed(job)
    finally:
        release_job(job.pk)  # held by claim()


def _run_claimed(job: Job) -> None:
    task_name = task_for(job)
    if task_name is None:
        job.fail(JobNotRetryable(f"No task runs jobs of kind {job.kind!r}."))
        return
    token = claimed_job.set(job.pk)  # claim() took it: the task must not take it again
    try:
        TASKS[task_name](job_id=job.pk)
    except TRANSIENT as exc:
        try:
            queue_again_later(job.pk, exc, WORKER)  # a worker claims it after the backoff
        except (OperationalError, InterfaceError):
            # The database is still away: the job stays marked running by this process, and
            # recover_orphaned() (when this worker next finds no work) queues it again.
            logger.warning("Job %s could not be queued again yet", job.pk, exc_info=True)
    except Exception:
        logger.exception("Job %s (%s) failed", job.pk, task_name)
    finally:
        claimed_job.reset(token)


def work(
    *,
    burst: bool = False,
    stop: threading.Event | None = None,
    worker: str | None = None,
    on_job: Callable[[Job], Any] | None = None,
) -> list[int]:
    """Claim and run jobs queued for rag_worker until ``stop`` is set (with ``burst``, until
    none is left). Returns the ids of the jobs this worker ran."""
    stop = stop or threading.Event()
    ran: list[int] = []
    while not stop.is_set():
        # Like a request: drop connections that broke or outlived CONN_MAX_AGE between jobs
        # (not inside a caller's transaction, which closing would end).
        if not connections[router.db_for_write(Job)].in_atomic_block:
            close_old_connections()
        try:
            job = claim(worker)
            if job is None and recover_orphaned(this_process_only=True):
                continue  # queued again: claim them
        except (OperationalError, InterfaceError):
            # The database restarted or the network blinked: wait, reconnect, go on.
            logger.warning("rag_worker could not reach the database", exc_info=True)
            connections.close_all()
            stop.wait(jobs_setting("POLL_SECONDS"))
            continue
        if job is None:
            waiting = _next_retry_in() if burst else None
            if burst and waiting is None:
                break
            # A job queued again after a transient failure is still queued while it waits for
            # its backoff: a burst worker stays for it.
            poll = jobs_setting("POLL_SECONDS")
            stop.wait(poll if waiting is None else min(poll, max(waiting, 0.05)))
            continue
        if on_job is not None:
            on_job(job)
        run(job)
        ran.append(job.pk)
    return ran

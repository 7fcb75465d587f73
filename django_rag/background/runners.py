"""Handing work to a runner: Celery, the thread pool of this process, rag_worker (the job waits in
the table) or inline; and the heartbeat a running job beats.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from django.db import InterfaceError, OperationalError, connections, router, transaction

from ..conf import jobs_setting, on_reset, scrub_text
from ..exceptions import BackgroundUnavailable
from ..models import Job
from .modes import CELERY, THREAD, WORKER, mode
from .registry import KIND_FOR_TASK, TASKS, worker_name
from .transient import TRANSIENT, queue_again_later

logger = logging.getLogger("django_rag.background")


def enqueue(
    task_name: str,
    job: Job,
    *,
    on_failure: Callable[[], Any] | None = None,
    runner: str | None = None,
) -> Job:
    """Run the task ``task_name`` (``task(job_id=job.pk)``) in the active mode (``runner``
    overrides it).

    When the work cannot be handed over (the broker is down, the process is shutting down),
    the job is marked failed, ``on_failure`` runs (to remove what was waiting for the task) and
    :class:`BackgroundUnavailable` is raised.
    """
    task = TASKS[task_name]
    runner = runner or mode()
    Job.objects.filter(pk=job.pk).update(runner=runner)
    job.runner = runner

    def unavailable(exc: BaseException, where: str, fix: str) -> BackgroundUnavailable:
        if on_failure is not None:
            on_failure()  # (removing a pending document supersedes its job: fail it after)
        job.fail(exc)
        return BackgroundUnavailable(
            f"The task could not be handed to {where} ({type(exc).__name__}: "
            f"{scrub_text(exc)}). {fix}"
        )

    if runner == CELERY:

        def send() -> None:
            try:
                result = task.apply_async(kwargs={"job_id": job.pk})
            except Exception as exc:  # kombu's OperationalError, a refused connection...
                raise unavailable(
                    exc,
                    "the Celery broker",
                    "Start the broker, or set DJANGO_RAG['BACKGROUND'] = 'thread' (or 'inline') "
                    "to run background work in this process.",
                ) from exc
            Job.objects.filter(pk=job.pk).update(task_id=result.id)
            job.task_id = result.id

        # Inside a transaction (ATOMIC_REQUESTS, a caller's atomic block) the worker must not
        # look for rows that are not committed yet: send when the transaction commits (outside
        # one, at once, so a broker failure reaches the caller as BackgroundUnavailable).
        transaction.on_commit(send, using=router.db_for_write(Job))
        return job
    if runner == THREAD:

        def submit() -> None:
            try:
                _pool().submit(_run_in_thread, task_name, job.pk)
            except RuntimeError as exc:  # the interpreter is shutting down
                raise unavailable(
                    exc, "the thread pool", "Try again, or run manage.py rag_worker."
                ) from exc

        # The pool's threads use their own connections: they must find the rows committed.
        transaction.on_commit(submit, using=router.db_for_write(Job))
        return job
    if runner == WORKER:
        return job  # pending with runner="worker": a rag_worker claims it
    task(job_id=job.pk)
    job.refresh_from_db()
    return job


def start(task_name: str, **params: Any) -> Job:
    """Create a job for ``django_rag.tasks.<task_name>`` with ``params`` and queue it."""
    if task_name not in KIND_FOR_TASK:
        raise ValueError(
            f"No job kind runs the task {task_name!r}; tasks: {', '.join(sorted(KIND_FOR_TASK))}"
        )
    job = Job.objects.create(kind=KIND_FOR_TASK[task_name], params=params)
    return enqueue(task_name, job)


def enqueue_reembed(**params: Any) -> Job:
    """Queue :func:`django_rag.maintenance.reembed` with ``params``; returns its Job."""
    job = Job.objects.create(kind=Job.Kind.REEMBED_TASK, params={"options": params})
    return enqueue("reembed", job)


_pool_lock = threading.Lock()


_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=int(jobs_setting("THREADS")), thread_name_prefix="django-rag-job"
            )
        return _executor


@on_reset
def _resize_pool() -> None:
    # A changed JOBS["THREADS"] takes effect for the next job; queued work still runs.
    global _executor
    with _pool_lock:
        if _executor is not None:
            _executor.shutdown(wait=False)
            _executor = None


def _run_in_thread(task_name: str, job_id: int) -> None:
    try:
        Job.objects.filter(pk=job_id).update(worker=worker_name())
        TASKS[task_name](job_id=job_id)
    except TRANSIENT as exc:
        try:
            delay = queue_again_later(job_id, exc, THREAD)
        except (OperationalError, InterfaceError):
            # The database is still away: the job shows as stalled, and a retry runs it.
            logger.warning("Job %s could not be queued again", job_id, exc_info=True)
            delay = None
        if delay is not None:
            timer = threading.Timer(delay, _submit_again, args=(task_name, job_id))
            timer.daemon = True
            timer.start()
    except Exception:
        # The job row has the error (the task marks it failed); the log has the traceback.
        logger.exception("Background job %s (%s) failed", job_id, task_name)
    finally:
        connections.close_all()  # this thread's connections only


def _submit_again(task_name: str, job_id: int) -> None:
    try:
        _pool().submit(_run_in_thread, task_name, job_id)
    except RuntimeError:  # shutting down: the job stays pending and shows as stalled
        logger.warning("Job %s could not be queued again: the process is stopping", job_id)


@contextmanager
def heartbeat(job: Job) -> Iterator[None]:
    """Beat ``job``'s heartbeat every ``JOBS["HEARTBEAT_SECONDS"]`` while the block runs (a
    daemon thread, so a hung or killed process stops beating and its job shows as stalled)."""
    interval = jobs_setting("HEARTBEAT_SECONDS")
    if connections[router.db_for_write(Job)].in_atomic_block:
        # Inside the caller's transaction (inline work under ATOMIC_REQUESTS, say) no other
        # process could see the beats, and the beating connection would wait on the row this
        # transaction may hold: no heartbeat.
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(interval):
                try:
                    job.beat()
                except Exception:  # a lost connection: try again at the next beat
                    logger.warning("Heartbeat of job %s failed", job.pk, exc_info=True)
                    connections.close_all()
        finally:
            connections.close_all()

    thread = threading.Thread(target=beat, name=f"django-rag-heartbeat-{job.pk}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval + 5)  # a beat stuck on a lock must not hold the work

"""Run long work outside the caller: on Celery, in a thread pool, on ``rag_worker`` processes,
or inline.

``DJANGO_RAG["BACKGROUND"]`` (docs/background.md):

- ``"auto"`` (default): ``"celery"`` when the host project's Celery app has a broker URL and is
  not eager, else ``"thread"``.
- ``"celery"``: send tasks to the broker (an error when none is configured).
- ``"thread"``: a pool of ``JOBS["THREADS"]`` threads in the calling process (the web server):
  the request returns at once, the job runs after it.
- ``"worker"``: the job waits in the ``Job`` table until a ``manage.py rag_worker`` process
  claims it (``SELECT ... FOR UPDATE SKIP LOCKED``: each job goes to one worker).
- ``"inline"`` (alias ``"sync"``): run the task body synchronously (tests, scripts).

Every mode runs the same task bodies (django_rag.tasks) and records the same job rows: status,
progress, a heartbeat while running, result or error.
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    router,
    transaction,
)
from django.db.models import Q, QuerySet
from django.utils import timezone

from .conf import background_setting, jobs_setting, on_reset, scrub_text
from .exceptions import (
    BackgroundUnavailable,
    ConfigurationError,
    EmbeddingFailed,
    JobNotRetryable,
    LLMError,
    MissingDependency,
)
from .models import Document, Job
from .models.databases import on_live_connection

logger = logging.getLogger("django_rag.background")

CELERY, THREAD, WORKER, INLINE = "celery", "thread", "worker", "inline"

# Worth another attempt: provider hiccups and lost database connections. Celery retries them
# (django_rag.tasks), and so do rag_worker and the thread pool, with the same backoff.
TRANSIENT = (EmbeddingFailed, LLMError, OperationalError, InterfaceError)
MAX_RETRIES = 5
BACKOFF_MAX_SECONDS = 60


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1``: 1, 2, 4... up to a minute."""
    return float(min(2 ** max(attempt - 1, 0), BACKOFF_MAX_SECONDS))


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
    }


# Task name -> task (a Celery task, or the plain function without Celery). Filled by
# django_rag.tasks as it is imported (the app config imports it when Django starts), so this
# module, which every layer may use to queue work, never imports the tasks themselves.
_TASKS: dict[str, Callable[..., Any]] = {}

#: The task (its name in django_rag.tasks) that runs each kind of job: the one place a kind
#: and its task meet. The reembed task renames its job to "reembed" or "embedding-switch" as it
#: starts; those kinds also name a command's own foreground job (no runner), which no task
#: runs again (rag_reembed --resume does).
TASK_FOR_KIND: dict[str, str] = {
    Job.Kind.INGEST: "ingest_document",
    Job.Kind.REEMBED: "reembed",
    Job.Kind.REEMBED_TASK: "reembed",
    Job.Kind.SWITCH: "reembed",
    Job.Kind.BUILD_GRAPH: "build_graph",
    Job.Kind.DETECT_COMMUNITIES: "detect_communities",
    Job.Kind.SUMMARIZE_COMMUNITIES: "summarize_communities",
    Job.Kind.RUN_EVALUATION: "run_evaluation",
    Job.Kind.GENERATE_TEST_CASES: "generate_test_cases",
    Job.Kind.SYNC_ROW: "sync_row",
    Job.Kind.SYNC: "sync",
}
#: The kind of job :func:`start` creates for a task (the first kind listed for it above).
KIND_FOR_TASK: dict[str, str] = {}
for _kind, _task in TASK_FOR_KIND.items():
    KIND_FOR_TASK.setdefault(_task, _kind)


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make ``task`` runnable by ``enqueue(name, job)``."""

    def decorate(task: Callable[..., Any]) -> Callable[..., Any]:
        _TASKS[name] = task
        return task

    return decorate


# Job kind -> what to undo when a job of that kind is failed outside its task (its process is
# gone): an ingest job's document must not stay "processing" with no runner. Filled by
# django_rag.tasks (this module may not import the layers that write documents).
_ABANDON: dict[str, Callable[[Job, str], Any]] = {}


def on_abandoned(kind: str) -> Callable[[Callable[[Job, str], Any]], Callable[[Job, str], Any]]:
    """Decorator: ``undo(job, error)`` runs when a job of ``kind`` is failed for its task
    (see :func:`recover_orphaned`)."""

    def decorate(undo: Callable[[Job, str], Any]) -> Callable[[Job, str], Any]:
        _ABANDON[kind] = undo
        return undo

    return decorate


def _abandon(job: Job, exc: BaseException) -> None:
    """Fail ``job`` for a task that can no longer record it (its process died), and what the
    task was doing (an ingest job's document) with it."""
    job.fail(exc)
    undo = _ABANDON.get(job.kind)
    if undo is not None:
        undo(job, job.error)


def task_for(job: Job) -> str | None:
    """The name of the task that runs ``job``, or None (a command's own foreground job)."""
    if job.kind in (Job.Kind.REEMBED, Job.Kind.SWITCH) and not job.runner:
        return None
    name = TASK_FOR_KIND.get(job.kind)
    return name if name in _TASKS else None


def worker_name() -> str:
    thread = threading.current_thread()
    suffix = "" if thread is threading.main_thread() else f":{thread.name}"
    return f"{_process_name()}{suffix}"


def _process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --- queueing -------------------------------------------------------------------------------


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
    task = _TASKS[task_name]
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


# --- the thread pool ------------------------------------------------------------------------

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
        _TASKS[task_name](job_id=job_id)
    except TRANSIENT as exc:
        try:
            delay = _queue_again_later(job_id, exc, THREAD)
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


def _queue_again_later(job_id: int, exc: BaseException, runner: str) -> float | None:
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


# --- heartbeat ------------------------------------------------------------------------------


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


# --- stalled jobs and retries ---------------------------------------------------------------


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


# --- rag_worker -----------------------------------------------------------------------------


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
            if running_here(job.pk) or _claimed.get() == job.pk:
                continue
            why = "its run in this process ended without recording how (the database was lost)"
        elif this_process_only or _alive(int(pid)):
            continue
        else:
            why = f"its worker process ({job.worker}) is gone"
        _abandon(job, RuntimeError(why))
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


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
        _hold(job.pk)
        try:
            job.save(update_fields=["status", "worker", "heartbeat_at"])
        except BaseException:
            _release(job.pk)
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
        _release(job.pk)  # held by claim()


def _run_claimed(job: Job) -> None:
    task_name = task_for(job)
    if task_name is None:
        job.fail(JobNotRetryable(f"No task runs jobs of kind {job.kind!r}."))
        return
    token = _claimed.set(job.pk)  # claim() took it: the task must not take it again
    try:
        _TASKS[task_name](job_id=job.pk)
    except TRANSIENT as exc:
        try:
            _queue_again_later(job.pk, exc, WORKER)  # a worker claims it after the backoff
        except (OperationalError, InterfaceError):
            # The database is still away: the job stays marked running by this process, and
            # recover_orphaned() (when this worker next finds no work) queues it again.
            logger.warning("Job %s could not be queued again yet", job.pk, exc_info=True)
    except Exception:
        logger.exception("Job %s (%s) failed", job.pk, task_name)
    finally:
        _claimed.reset(token)


# The job a rag_worker claimed and is running in this context.
_claimed: contextvars.ContextVar[int | None] = contextvars.ContextVar(
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
    busy = _hold(job_id)
    try:
        yield take(job_id, busy_here=busy)
    finally:
        _release(job_id)


def _hold(job_id: int) -> bool:
    """Count ``job_id`` as running in this process; returns whether it already was."""
    with _running_lock:
        busy = _running_here[job_id] > 0
        _running_here[job_id] += 1
    return busy


def _release(job_id: int) -> None:
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
    if _claimed.get() == job_id:
        return True
    running = Q(status=Job.Status.RUNNING)
    if busy_here:
        cutoff = timezone.now() - timedelta(seconds=jobs_setting("STALLED_AFTER_SECONDS"))
        here = _process_name()
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

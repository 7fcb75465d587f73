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

Where things are: :mod:`.modes` (the mode now), :mod:`.registry` (job kinds and their tasks),
:mod:`.runners` (handing work to a runner, the thread pool, the heartbeat), :mod:`.claiming`
(taking a job so that it runs once at a time), :mod:`.transient` (automatic retries with
backoff), :mod:`.stalled` (stalled jobs, retries by hand), :mod:`.worker` (rag_worker).
"""

from __future__ import annotations

from .claiming import running_here, take, taken
from .modes import CELERY, DESCRIPTIONS, INLINE, THREAD, WORKER, describe, mode, use_celery
from .registry import KIND_FOR_TASK, TASK_FOR_KIND, on_abandoned, register, task_for, worker_name
from .runners import enqueue, enqueue_reembed, heartbeat, start
from .stalled import is_stalled, retry, retryable, runner_gone, stalled, why_not_retryable
from .transient import BACKOFF_MAX_SECONDS, MAX_RETRIES, TRANSIENT, backoff
from .worker import claim, recover_orphaned, run, work

__all__ = [
    "BACKOFF_MAX_SECONDS",
    "CELERY",
    "DESCRIPTIONS",
    "INLINE",
    "KIND_FOR_TASK",
    "MAX_RETRIES",
    "TASK_FOR_KIND",
    "THREAD",
    "TRANSIENT",
    "WORKER",
    "backoff",
    "claim",
    "describe",
    "enqueue",
    "enqueue_reembed",
    "heartbeat",
    "is_stalled",
    "mode",
    "on_abandoned",
    "recover_orphaned",
    "register",
    "retry",
    "retryable",
    "run",
    "runner_gone",
    "running_here",
    "stalled",
    "start",
    "take",
    "taken",
    "task_for",
    "use_celery",
    "why_not_retryable",
    "work",
    "worker_name",
]

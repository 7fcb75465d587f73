"""The tasks registry: which task runs each kind of job, the task bodies (registered by
django_rag.tasks as it is imported, so this package never imports the layers above it), what to
undo when a job is failed outside its task, and the names runners record on the jobs they run.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..models import Job

# Task name -> task (a Celery task, or the plain function without Celery). Filled by
# django_rag.tasks as it is imported (the app config imports it when Django starts), so this
# module, which every layer may use to queue work, never imports the tasks themselves.
TASKS: dict[str, Callable[..., Any]] = {}


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
        TASKS[name] = task
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


def abandon(job: Job, exc: BaseException) -> None:
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
    return name if name in TASKS else None


def worker_name() -> str:
    thread = threading.current_thread()
    suffix = "" if thread is threading.main_thread() else f":{thread.name}"
    return f"{process_name()}{suffix}"


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user counts). On
    Windows it is taken as alive: ``os.kill`` there ends a process instead of probing it."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def process_on_this_host(worker: str) -> int | None:
    """The process id in a job's ``worker`` name (``host:pid[:thread]``) when that process ran
    on this machine, else None."""
    host, _, rest = worker.partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return int(pid)

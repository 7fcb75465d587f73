"""Celery tasks. Each takes a Job id, is idempotent, acknowledges late (a killed worker's task
is delivered again) and retries transient failures with exponential backoff.

Without Celery (or with no broker: see :mod:`django_rag.background`) the same functions run
in a thread pool, on rag_worker processes or inline.
"""

from __future__ import annotations

import logging

from django.db import router

from . import maintenance
from .background import (
    BACKOFF_MAX_SECONDS,
    MAX_RETRIES,
    TRANSIENT,
    heartbeat,
    on_abandoned,
    register,
    taken,
)
from .evaluation import generate_test_cases as generate
from .evaluation import run_evaluation as evaluate
from .exceptions import DocumentSuperseded
from .graph import build_graph as build
from .graph import detect_communities as detect
from .graph import summarize_communities as summarize
from .ingestion.folders import sync_folder
from .ingestion.service import abandon_pending, process_pending
from .models import Job
from .sync import reconcile
from .sync import sync_row as sync_one_row

try:
    from celery import shared_task
except ImportError:  # inline only

    def shared_task(*args, **kwargs):
        return lambda func: func


OPTIONS = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": BACKOFF_MAX_SECONDS,
    "max_retries": MAX_RETRIES,
}


def _run(job_id: int, body) -> None:
    with taken(job_id) as ours:
        if ours:  # else completed, superseded, or another runner has it
            _run_taken(job_id, body)


def _run_taken(job_id: int, body) -> None:
    # Where jobs are written: a replica may not have the row the task was sent for yet.
    job = Job.objects.using(router.db_for_write(Job)).get(pk=job_id)
    job.start()
    try:
        with heartbeat(job):
            result = body(job)
    except DocumentSuperseded as exc:  # a newer version won: not a failure, nothing to retry
        job.supersede(exc)
        return
    except BaseException as exc:
        job.fail(exc)
        raise
    job.finish(result)


@register("ingest_document")
@shared_task(name="django_rag.ingest_document", **OPTIONS)
def ingest_document(job_id: int) -> None:
    """Chunk, embed and store a document saved as pending by ``ingest(..., background=True)``."""

    def body(job):
        document = process_pending(job)
        return {"document_id": document.pk, "chunk_count": document.chunk_count}

    _run(job_id, body)


on_abandoned(Job.Kind.INGEST)(abandon_pending)


@register("reembed")
@shared_task(name="django_rag.reembed", **OPTIONS)
def reembed(job_id: int) -> None:
    """:func:`django_rag.maintenance.reembed` with the job's options; resumes its own job."""

    def body(job):
        options = dict(job.params.get("options", job.params))
        options["resume"] = True
        maintenance.reembed(job=job, **options)

    _run(job_id, body)


@register("run_evaluation")
@shared_task(name="django_rag.run_evaluation", **OPTIONS)
def run_evaluation(job_id: int) -> None:
    """:func:`django_rag.evaluation.run_evaluation` with the job's options."""

    def body(job):
        run = evaluate(progress=_progress(job), **job.params)
        return {"run_id": run.pk, "metrics": run.metrics}

    _run(job_id, body)


def _progress(job: Job):
    return job.report


@register("build_graph")
@shared_task(name="django_rag.build_graph", **OPTIONS)
def build_graph(job_id: int) -> None:
    """:func:`django_rag.graph.build_graph` with the job's options."""

    _run(job_id, lambda job: build(progress=_progress(job), **job.params))


@register("detect_communities")
@shared_task(name="django_rag.detect_communities", **OPTIONS)
def detect_communities(job_id: int) -> None:
    """:func:`django_rag.graph.detect_communities` with the job's options."""

    _run(job_id, lambda job: detect(progress=_progress(job), **job.params))


@register("summarize_communities")
@shared_task(name="django_rag.summarize_communities", **OPTIONS)
def summarize_communities(job_id: int) -> None:
    """:func:`django_rag.graph.summarize_communities` with the job's options."""

    _run(job_id, lambda job: summarize(progress=_progress(job), **job.params))


@register("generate_test_cases")
@shared_task(name="django_rag.generate_test_cases", **OPTIONS)
def generate_test_cases(job_id: int) -> None:
    """:func:`django_rag.evaluation.generate_test_cases` with the job's options."""

    def body(job):
        result = generate(progress=_progress(job), **job.params)
        return {"created": len(result.created), "skipped": result.skipped}

    _run(job_id, body)


@register("sync_row")
@shared_task(name="django_rag.sync_row", **OPTIONS)
def sync_row(job_id: int) -> None:
    """:func:`django_rag.sync.sync_row`: bring one registered row's document in step."""

    _run(job_id, lambda job: sync_one_row(**job.params))


@register("sync")
@shared_task(name="django_rag.sync", **OPTIONS)
def sync(job_id: int) -> None:
    """:func:`django_rag.sync.reconcile` for the job's model, or
    :func:`django_rag.ingestion.folders.sync_folder` for its folder (the dashboard's Check,
    Reconcile and Sync)."""

    def body(job):
        params = dict(job.params)
        if params.get("folder"):
            report = sync_folder(
                params["folder"],
                collection=params["collection"],
                prefix=params.get("prefix", ""),
                dry_run=bool(params.get("dry_run")),
                progress=_progress(job),
                record=False,  # this job is the record
            )
            return {**report.counts(), "failed_files": sorted(report.failed)[:5]}
        (report,) = reconcile(progress=_progress(job), **params)
        result = report.to_dict()
        result["errors"] = result["errors"][:5]
        return result

    _run(job_id, body)


def preload_in_worker(**kwargs) -> None:
    """``worker_process_init`` (each prefork child, the solo pool) and ``worker_init`` (thread,
    gevent and eventlet pools, which send no process signal): load the configured models when
    ``PRELOAD_MODELS`` is on, so the first task does not wait for them. A failure is logged;
    the tasks then report it."""
    from .conf import get_setting

    if not get_setting("PRELOAD_MODELS"):
        return
    sender = kwargs.get("sender")
    if sender is not None and hasattr(sender, "pool_cls"):  # worker_init, in the main process
        pool = sender.pool_cls  # "prefork", "threads"... or the class, by this point
        pool = f"{getattr(pool, '__module__', '')}.{pool}".lower()
        # prefork and solo send worker_process_init (where the work runs); loading torch in a
        # prefork parent would also be inherited by forked children, which it does not survive.
        if "prefork" in pool or "solo" in pool:
            return
    try:
        names = maintenance.preload_models()
    except Exception:
        logging.getLogger("django_rag").exception("preloading models in the worker failed")
        return
    if names:
        logging.getLogger("django_rag").info("preloaded %s", ", ".join(names))


try:
    from celery.signals import worker_init, worker_process_init
except ImportError:  # inline only: nothing to preload for
    pass
else:
    worker_process_init.connect(preload_in_worker, weak=False, dispatch_uid="django_rag_preload")
    worker_init.connect(preload_in_worker, weak=False, dispatch_uid="django_rag_preload_init")

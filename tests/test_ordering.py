"""The newest version of an identity wins, whatever runs the jobs and in whatever order.

Several versions of one (collection, source_id) are queued with ``replace=True`` before any
runner takes them; runners then run the jobs in random orders, with duplicate deliveries and
retries, on real threads (the thread pool's task body), on ``rag_worker`` processes and inline.
Exactly the newest version is stored, an older job that runs after it ends ``superseded`` (not
failed), and the BM25 statistics equal a recount. A real Celery worker runs the same scenario in
tests/test_celery_worker.py.
"""

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections
from django.test import override_settings

import django_rag as rag
from django_rag import background
from django_rag.background import registry as background_registry
from django_rag.background import runners as background_runners
from django_rag.exceptions import DocumentSuperseded, JobNotRetryable
from django_rag.models import Document, Job, SourceVersion
from django_rag.store import delete_source, recount_statistics

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent
VERSIONS = 5


def version_text(number: int) -> str:
    return f"Pump manual version {number}. " + f"The valve{number} setting is {number * 7}. " * 8


def queue_versions(count=VERSIONS, collection="bg", source_id="s"):
    """Queue ``count`` versions (replace=True) and return their jobs, oldest first."""
    return [
        rag.ingest(
            version_text(number),
            collection=collection,
            source_id=source_id,
            replace=True,
            background=True,
        ).job
        for number in range(1, count + 1)
    ]


def stored_texts(collection="bg", source_id="s"):
    return list(
        Document.objects.filter(collection__name=collection, source_id=source_id).values_list(
            "content", "status"
        )
    )


def assert_newest_stored(jobs, collection="bg", source_id="s"):
    assert stored_texts(collection, source_id) == [(version_text(len(jobs)), "completed")]
    statuses = {job.pk: Job.objects.get(pk=job.pk).status for job in jobs}
    assert statuses[jobs[-1].pk] == "completed", statuses
    assert set(statuses.values()) <= {"completed", "superseded"}, statuses
    counts = recount_statistics()
    assert counts["stored"] == counts["recount"]
    hit = rag.search("valve setting", collection=collection, mode="fulltext", limit=3)
    assert {result.document_id for result in hit} == {
        Document.objects.get(collection__name=collection, source_id=source_id).pk
    }
    return statuses


def run_task(job_id):
    # What a pool thread runs (background._run_in_thread): the registered task body.
    background_runners._run_in_thread("ingest_document", job_id)


@pytest.mark.parametrize("seed", range(4))
def test_threads_run_queued_versions_in_random_order_with_duplicates(seed):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        jobs = queue_versions()
        rng = random.Random(seed)
        order = [job.pk for job in jobs] * 2  # every job delivered twice
        rng.shuffle(order)
        lanes = [order[i::3] for i in range(3)]

        def lane(ids):
            try:
                for job_id in ids:
                    run_task(job_id)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=lane, args=(ids,)) for ids in lanes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert_newest_stored(jobs)


def test_older_jobs_that_run_after_the_newest_end_superseded():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        jobs = queue_versions()
        for job in reversed(jobs):  # the newest first
            run_task(job.pk)
        statuses = assert_newest_stored(jobs)
    assert [statuses[job.pk] for job in jobs] == ["superseded"] * (VERSIONS - 1) + ["completed"]
    older = Job.objects.get(pk=jobs[0].pk)
    assert "replaced by a newer version" in older.error
    # Nothing to retry: its document is gone and a newer version is stored.
    with pytest.raises(JobNotRetryable, match="superseded"):
        background.retry(older)


def test_the_exact_report_two_uploads_then_a_worker_keeps_the_newer():
    """The reported loss: v1 and v2 queued with replace, then `rag_worker --burst` kept v1."""
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        a = rag.ingest("v1 text", collection="bg", source_id="s", replace=True, background=True)
        b = rag.ingest("v2 text", collection="bg", source_id="s", replace=True, background=True)
        assert a.version < b.version
        process = subprocess.run(
            [sys.executable, "-m", "django", "rag_worker", "--burst"],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
                "DJANGO_RAG_TEST_EMBEDDER": "hashing",
                "DJANGO_RAG_TEST_BACKGROUND": "worker",
            },
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert process.returncode == 0, process.stdout + process.stderr
    assert stored_texts() == [("v2 text", "completed")]
    assert Job.objects.get(pk=a.job.pk).status in ("completed", "superseded")
    assert Job.objects.get(pk=b.job.pk).status == "completed"


def test_thread_pool_keeps_the_newest_of_many_queued_versions():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "thread"}):
        jobs = queue_versions(8)
        deadline = time.monotonic() + 120
        while Job.objects.filter(pk__in=[j.pk for j in jobs], status__in=["pending", "running"]):
            assert time.monotonic() < deadline, list(Job.objects.values_list("status", "error"))
            time.sleep(0.1)
        assert_newest_stored(jobs)


def test_inline_versions_and_a_foreground_write_overtaken_by_a_newer_one():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        jobs = queue_versions(3)  # inline: each runs as it is queued
        assert_newest_stored(jobs)
        # A foreground write submitted before a newer one but stored after it is superseded:
        # its version is taken at the call, before embedding.
        from django_rag.ingestion import pipeline, service
        from django_rag.ingestion.request import build_ingest_request

        slow = pipeline.validate(
            pipeline.text_document("older text", "text"),
            collection="bg",
            source_id="s",
            replace=True,
        )
        pipeline.take_versions([slow])
        rag.ingest("newer text", collection="bg", source_id="s", replace=True)
        request = build_ingest_request("ingest", {"collection": "bg"})
        prepared = service.prepare_document(slow, request)
        returned = pipeline.store_prepared(slow, prepared)
    # Like a duplicate: the caller gets what is stored for the identity, flagged.
    assert returned.superseded and returned.content == "newer text"
    assert stored_texts() == [("newer text", "completed")]
    with pytest.raises(DocumentSuperseded) as caught:  # what the store raises underneath
        from django_rag.store import write_document

        write_document(slow.document, [], collection="bg", model_name="m", replace=True)
    assert caught.value.code == "document_superseded"


def test_a_deleted_source_is_not_brought_back_by_an_older_job():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        jobs = queue_versions(2)
        run_task(jobs[0].pk)
        assert delete_source("bg", "s") == 2  # the stored one and the pending one
        run_task(jobs[1].pk)
        assert stored_texts() == []
        assert Job.objects.get(pk=jobs[1].pk).status == "superseded"
        fence = SourceVersion.objects.get(source_id="s")
        assert fence.deleted and fence.version > jobs[1].params["version"]
        # A newer write after the delete is stored again.
        rag.ingest("back again", collection="bg", source_id="s", replace=True)
    assert stored_texts() == [("back again", "completed")]
    assert not SourceVersion.objects.get(source_id="s").deleted


def test_a_batch_replace_keeps_a_newer_pending_version():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        older = rag.ingest_many([{"text": "batch v1", "source_id": "s"}], collection="bg")
        (pending,) = queue_versions(1)
        # A batch submitted after the pending version replaces it...
        rag.ingest_many([{"text": "batch v3", "source_id": "s"}], collection="bg", replace=True)
        run_task(pending.pk)
    assert Job.objects.get(pk=pending.pk).status == "superseded"
    assert stored_texts() == [("batch v3", "completed")]
    assert not Document.objects.filter(pk=older[0].pk).exists()


def test_versions_with_transient_failures_retried_in_random_order(hashing):
    """Some attempts fail (a provider hiccup); the failed jobs are retried in a random order,
    duplicates included, while the others run: still exactly the newest version is stored."""
    failing = {"version 6.", "version 3."}  # the newest and one older: their first attempt
    lock = threading.Lock()

    class Flaky(type(hashing)):
        def _embed(self, texts):
            with lock:
                hit = {mark for mark in failing if any(mark in text for text in texts)}
                failing.difference_update(hit)
            if hit:
                raise ConnectionError("provider hiccup")
            return super()._embed(texts)

    with override_settings(DJANGO_RAG={"EMBEDDER": Flaky(), "BACKGROUND": "worker"}):
        jobs = queue_versions(6)
        rng = random.Random(11)
        order = [job.pk for job in jobs]
        rng.shuffle(order)
        for job_id in order:
            try:  # the task body itself: a failure stays on the job (no automatic requeue)
                background_registry.TASKS["ingest_document"](job_id=job_id)
            except Exception:
                pass
        assert Job.objects.get(pk=jobs[-1].pk).status == "failed"  # the newest, for now
        for _ in range(5):  # retry what failed (twice each: a duplicate retry is refused)
            failed = list(Job.objects.filter(status="failed").order_by("?"))
            if not failed:
                break
            for job in failed + failed:
                try:
                    background.retry(job, runner="worker")
                except JobNotRetryable:
                    pass  # queued already, or superseded meanwhile
            background.work(burst=True)
            Job.objects.filter(status="pending").update(not_before=None)  # skip the backoff
            background.work(burst=True)
        assert_newest_stored(jobs)


def test_a_failed_job_whose_document_is_deleted_ends_superseded_without_retry():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        document = rag.ingest("A valve note.", collection="bg", background=True)
        Job.objects.get(pk=document.job.pk).fail(RuntimeError("the embedder was down"))
        rag.delete(document)
    job = Job.objects.get(pk=document.job.pk)
    assert job.status == "superseded" and "deleted before it was stored" in job.error
    assert not background.retryable(job)

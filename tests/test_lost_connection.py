"""Jobs that survive the database, on real rag_worker processes against real PostgreSQL.

The job's backend is terminated (``pg_terminate_backend``) while the job is held mid-work,
either while it embeds (no transaction open) or while the store's transaction waits for the
identity lock: the job ends ``failed`` with the error and its document ``failed`` (recorded on
a fresh connection), then the worker queues it again with backoff and completes it. A job left
``running`` by a killed rag_worker is recovered by the next worker that starts. Status changes
are recorded by triggers (tests/backends.py), so even a failure that lasts a millisecond shows.
The Celery versions of these tests are in tests/test_celery_worker.py. In-process tests below
cover what the processes cannot stage reliably: a job left running by its own process when even
its failure could not be written, and a backend cut just before a job starts or finishes.
"""

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

import django_rag as rag
from django_rag import background
from django_rag.models import Document, Job
from tests.backends import (
    backends,
    history,
    identity_locked,
    statuses,
    terminate,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parent.parent
TEXT = "The pump must be primed before the first start. " * 40
APP = "django_rag_test_job_process"


def rag_worker(tmp_path, *args, **env):
    log = tmp_path / "rag_worker.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "rag_worker", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
            "DJANGO_RAG_TEST_EMBEDDER": "tests.embedders.FileGatedEmbedder",
            "DJANGO_RAG_TEST_APPLICATION_NAME": APP,
            **env,
        },
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
    )
    return process, log


def stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(10)


def assert_failed_then_retried(job_id, document_id):
    """The job failed with the lost connection's error, its document too, then a retry after
    the backoff completed both."""
    jobs = history("job", job_id)
    assert [row["status"] for row in jobs] == [
        "pending",
        "running",
        "failed",
        "pending",
        "running",
        "completed",
    ], jobs
    failed = jobs[2]
    assert failed["error"].startswith(("OperationalError", "InterfaceError")), failed
    # Queued again with backoff: not before background.backoff(1) seconds after the failure,
    # and not claimed before then.
    queued, again = jobs[3], jobs[4]
    assert queued["error"] == failed["error"]  # the reason stays visible while it waits
    assert (queued["not_before"] - failed["at"]).total_seconds() >= background.backoff(1) - 0.1
    assert again["at"] >= queued["not_before"]
    assert statuses("document", document_id) == [
        "pending",
        "processing",
        "failed",
        "processing",
        "completed",
    ]
    document_failed = history("document", document_id)[2]
    assert document_failed["error"].startswith(("OperationalError", "InterfaceError"))
    job = Job.objects.get(pk=job_id)
    assert job.status == "completed" and job.attempts == 2 and job.error == ""
    document = Document.objects.get(pk=document_id)
    assert document.status == "completed" and document.error == ""
    assert document.chunks.count() == document.chunk_count > 0
    hit = rag.search("primed before the first start", collection="manuals", limit=1)
    assert hit and hit[0].document_id == document_id


@pytest.mark.parametrize("where", ["embedding", "store"])
def test_rag_worker_job_whose_backend_is_terminated_fails_then_is_retried_to_completion(
    tmp_path, where, recorded_statuses
):
    gate, entered = tmp_path / "open", tmp_path / "entered"
    config = {"EMBEDDER": "hashing", "BACKGROUND": "worker"}
    with override_settings(DJANGO_RAG=config):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job = document.job
        # --burst: the worker must not leave while its job waits for its backoff.
        process, log = rag_worker(
            tmp_path,
            "--burst",
            DJANGO_RAG_TEST_GATE_FILE=str(gate),
            DJANGO_RAG_TEST_GATE_ENTERED=str(entered),
        )
        try:
            wait_for(entered.exists, "the job to start embedding", log=log)
            assert Document.objects.get(pk=document.pk).status == "processing"
            if where == "embedding":
                # The job's connection is idle (no transaction): cut every backend it has.
                terminate(wait_for(lambda: backends(APP), "the worker's backends", log=log))
                gate.touch()
            else:
                with identity_locked("manuals", "pump"):
                    gate.touch()
                    # The store's transaction is open and waits for the identity lock.
                    pids = wait_for(
                        lambda: backends(APP, waiting_on_advisory_lock=True),
                        "the write to wait inside its transaction",
                        log=log,
                    )
                    terminate(pids)
                    wait_for(
                        lambda: "failed" in statuses("job", job.pk), "the job to fail", log=log
                    )
            assert process.wait(120) == 0, log.read_text()
        finally:
            stop(process)
    assert_failed_then_retried(job.pk, document.pk)
    assert f"Job {job.pk} failed (OperationalError" in log.read_text()


def test_a_job_left_running_by_a_killed_rag_worker_is_recovered_when_a_worker_starts(
    tmp_path, recorded_statuses
):
    gate, entered = tmp_path / "open", tmp_path / "entered"
    # Stalled only after an hour: the new worker must not wait for that.
    config = {
        "EMBEDDER": "hashing",
        "BACKGROUND": "worker",
        "JOBS": {"STALLED_AFTER_SECONDS": 3600},
    }
    with override_settings(DJANGO_RAG=config):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job = document.job
        first, log = rag_worker(
            tmp_path, DJANGO_RAG_TEST_GATE_FILE=str(gate), DJANGO_RAG_TEST_GATE_ENTERED=str(entered)
        )
        try:
            wait_for(entered.exists, "the job to start embedding", log=log)
        finally:
            stop(first)  # SIGKILL mid-job
        dead = Job.objects.get(pk=job.pk)
        assert dead.status == "running" and dead.worker.endswith(f":{first.pid}")
        assert Document.objects.get(pk=document.pk).status == "processing"
        assert not background.stalled().filter(pk=job.pk).exists()
        gate.touch()
        second, log = rag_worker(tmp_path, "--burst", DJANGO_RAG_TEST_STALLED_AFTER="3600")
        try:
            assert second.wait(120) == 0, log.read_text()
        finally:
            stop(second)
    output = log.read_text()
    assert f"Job {job.pk}: its worker process is gone; recovered." in output, output
    failed = history("job", job.pk)[2]
    assert failed["status"] == "failed" and f":{first.pid}) is gone" in failed["error"]
    assert statuses("job", job.pk) == [
        "pending",
        "running",
        "failed",
        "pending",
        "running",
        "completed",
    ]
    # The document was failed with its job (no document stays processing without a runner),
    # then completed by the second worker.
    assert statuses("document", document.pk) == [
        "pending",
        "processing",
        "failed",
        "processing",
        "completed",
    ]
    job.refresh_from_db()
    document.refresh_from_db()
    assert job.status == "completed" and job.attempts == 2
    assert document.status == "completed" and document.chunks.count() == document.chunk_count > 0


def _left_running_here(**config):
    """A queued ingest job the table says runs in this process, with a fresh heartbeat, that no
    thread runs: what is left when the job's failure could not be recorded (the database was
    unreachable a while: Job.fail raised too) and the task gave up."""
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker", **config}):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
    Job.objects.filter(pk=document.job.pk).update(
        status="running", worker=background.worker_name(), heartbeat_at=timezone.now()
    )
    return document


def test_a_retry_delivered_to_the_process_that_left_its_job_running_runs_it():
    """Celery's autoretry after a failure that could not be recorded: the retry arrives in the
    same worker process, where the job still reads "running" with a fresh heartbeat. take()
    used to refuse it (as if another thread ran it), so the retry "succeeded" at once doing
    nothing and the job stayed running with no runner."""
    from django_rag import tasks

    document = _left_running_here()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        tasks.ingest_document(job_id=document.job.pk)
    job = Job.objects.get(pk=document.job.pk)
    assert job.status == "completed" and job.result["document_id"] == document.pk
    assert Document.objects.get(pk=document.pk).status == "completed"


def test_a_job_running_here_is_still_run_once_at_a_time():
    """What take() refuses in its own process: a job a thread of this process is running now
    (a second delivery of it waits for nothing and leaves it alone)."""
    from django_rag import tasks
    from tests.embedders import GatedEmbedder

    embedder = GatedEmbedder()
    with override_settings(DJANGO_RAG={"EMBEDDER": embedder, "BACKGROUND": "worker"}):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job_id = document.job.pk
        first = threading.Thread(target=_run_closing, args=(tasks.ingest_document, job_id))
        first.start()
        try:
            assert embedder.entered.wait(30)
            tasks.ingest_document(job_id=job_id)  # a second delivery while the first runs
            assert Job.objects.get(pk=job_id).attempts == 1  # refused: not started again
        finally:
            embedder.gate.set()
            first.join(60)
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts) == ("completed", 1)


def _run_closing(task, job_id):
    try:
        task(job_id=job_id)
    finally:
        connections.close_all()


def test_rag_worker_requeues_its_own_job_left_running_when_the_failure_could_not_be_recorded():
    """rag_worker's own orphan (the failure and the requeue could not be written while the
    database was away): the worker finds it when it next looks for work and queues it again,
    instead of leaving it running until STALLED_AFTER_SECONDS."""
    document = _left_running_here(JOBS={"STALLED_AFTER_SECONDS": 3600})
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        ran = background.work(burst=True)
    assert ran == [document.job.pk]
    job = Job.objects.get(pk=document.job.pk)
    assert job.status == "completed" and job.error == ""
    assert Document.objects.get(pk=document.pk).status == "completed"


def _terminate_own_backend():
    """Terminate this thread's backend from another connection (another thread's)."""
    pid = connection.cursor().connection.info.backend_pid

    def cut():
        try:
            terminate([pid])
        finally:
            connections.close_all()

    thread = threading.Thread(target=cut)
    thread.start()
    thread.join(30)


@pytest.mark.parametrize("step", ["start", "finish"])
def test_job_start_and_finish_outlive_a_backend_terminated_before_them(step):
    """A runner's connection may die while it waits (between jobs) or just after the work was
    stored: starting or completing the job replaces it instead of failing the job."""
    job = Job.objects.create(kind="ingest", status="running" if step == "finish" else "pending")
    _terminate_own_backend()
    if step == "start":
        job.start()
        assert (status_of(job), Job.objects.get(pk=job.pk).attempts) == ("running", 1)
    else:
        job.finish({"chunk_count": 3})
        assert status_of(job) == "completed"
        assert Job.objects.get(pk=job.pk).result == {"chunk_count": 3}


def status_of(job):
    return Job.objects.get(pk=job.pk).status


def test_a_retry_by_hand_does_not_wait_for_the_automatic_retrys_backoff():
    """A job waiting for its backoff (not_before ahead) that a person retries, or that a
    worker recovers, runs at once: retry() and recovery clear not_before."""
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job = document.job
        Job.objects.filter(pk=job.pk).update(
            status="failed", not_before=timezone.now() + timedelta(minutes=10)
        )
        background.retry(Job.objects.get(pk=job.pk), runner=background.WORKER)
        claimed = background.claim()
        assert claimed is not None and claimed.pk == job.pk
        background.run(claimed)
    assert status_of(job) == "completed"


def test_a_task_whose_idle_connection_died_between_jobs_runs_without_a_retry():
    """A worker's connection cut while it waited for work (a database restart overnight): the
    next task's first statement (taking the job) reconnects instead of failing the delivery
    and waiting for a retry's backoff."""
    from django_rag import tasks

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        _terminate_own_backend()
        tasks.ingest_document(job_id=document.job.pk)
    job = Job.objects.get(pk=document.job.pk)
    assert (job.status, job.attempts, job.error) == ("completed", 1, "")

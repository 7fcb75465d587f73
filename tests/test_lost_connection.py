"""Jobs that survive the database, on real rag_worker processes against real PostgreSQL.

The job's backend is terminated (``pg_terminate_backend``) while the job is held mid-work,
either while it embeds (no transaction open) or while the store's transaction waits for the
identity lock: the job ends ``failed`` with the error and its document ``failed`` (recorded on
a fresh connection), then the worker queues it again with backoff and completes it. A job left
``running`` by a killed rag_worker is recovered by the next worker that starts. Status changes
are recorded by triggers (tests/backends.py), so even a failure that lasts a millisecond shows.
The Celery versions of these tests are in tests/test_celery_worker.py.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

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

"""Background work without a broker, against real PostgreSQL with real threads and processes:
the thread pool runs a job after the request returns; rag_worker processes share the queue
(each job claimed once); a killed worker's job becomes stalled and a retry completes it.

Jobs here run on other database connections than the test's, so every test commits its rows
(transaction=True), as tests/test_concurrency.py does."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

import django_rag as rag
from django_rag import background
from django_rag.background import runners as background_runners
from django_rag.exceptions import JobNotRetryable
from django_rag.models import Chunk, Document, Job
from tests.embedders import GatedEmbedder

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parent.parent
TEXT = "The pump must be primed before the first start. " * 40


def wait_for(condition, what, timeout=60, log=None):
    """Poll ``condition`` (a safety limit, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    detail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


def status(job_id):
    return Job.objects.get(pk=job_id).status


@pytest.fixture
def staff_client():
    client = Client()
    client.force_login(User.objects.create_user("staff", password="pw", is_staff=True))
    return client


def test_thread_mode_runs_the_upload_after_the_request_returns(staff_client):
    embedder = GatedEmbedder()
    config = {"EMBEDDER": embedder, "BACKGROUND": "auto", "JOBS": {"HEARTBEAT_SECONDS": 0.05}}
    with override_settings(DJANGO_RAG=config):
        assert background.mode() == "thread"  # auto without a broker
        response = staff_client.post(
            reverse("django_rag_dashboard:upload"),
            {
                "collection": "manuals",
                "file": SimpleUploadedFile("pump.txt", TEXT.encode(), "text/plain"),
            },
        )
        # The response came back while the embedder is still closed: the job cannot be done.
        job = Job.objects.get(kind="ingest")
        assert response.status_code == 302
        assert response["Location"].endswith(f"/jobs/?job={job.pk}")
        document = Document.objects.get(pk=job.params["document_id"])
        assert job.runner == "thread" and job.status in ("pending", "running")
        assert document.status in ("pending", "processing") and document.chunk_count == 0

        # The pool's thread is inside the job, on its own connection, beating its heartbeat.
        assert embedder.entered.wait(30)
        job.refresh_from_db()
        assert job.status == "running" and "django-rag-job" in job.worker
        first_beat = job.heartbeat_at
        wait_for(lambda: Job.objects.get(pk=job.pk).heartbeat_at > first_beat, "a heartbeat")
        page = staff_client.get(reverse("django_rag_dashboard:jobs"), {"job": job.pk})
        html = page.content.decode()
        assert 'data-status="running"' in html and "<strong>thread</strong> mode" in html
        assert 'hx-trigger="every 2s"' in html  # the page polls while work runs

        embedder.gate.set()
        wait_for(lambda: status(job.pk) == "completed", "the job to complete")
    job.refresh_from_db()
    document.refresh_from_db()
    assert document.status == "completed" and document.chunk_count > 0
    assert Chunk.objects.filter(document=document).count() == document.chunk_count
    assert job.result == {"document_id": document.pk, "chunk_count": document.chunk_count}
    assert job.started_at <= job.finished_at and job.attempts == 1
    assert (job.done, job.total) == (document.chunk_count, document.chunk_count)  # progress
    page = staff_client.get(reverse("django_rag_dashboard:jobs")).content.decode()
    assert 'data-status="completed"' in page and "<th>Chunk count</th>" in page
    assert "{&#x27;" not in page and "hx-trigger" not in page  # no raw dict; polling stops


def _enqueue_ingests(count):
    return [
        rag.ingest(
            f"Document number {i} about valves and pumps.",
            collection="q",
            source_id=f"doc-{i}",
            background=True,
        ).job.pk
        for i in range(count)
    ]


def test_two_workers_claim_each_job_once():
    # Both workers must be inside a job at the same moment (a barrier in the embedder), so the
    # claims really race; SKIP LOCKED and the claim's commit keep them apart.
    barrier = threading.Barrier(2, timeout=30)
    met = threading.local()

    from django_rag.testing import HashingEmbedder

    class Meeting(HashingEmbedder):
        def _embed(self, texts):
            if not getattr(met, "done", False):
                met.done = True
                barrier.wait()
            return super()._embed(texts)

    with override_settings(DJANGO_RAG={"EMBEDDER": Meeting(), "BACKGROUND": "worker"}):
        ids = _enqueue_ingests(12)
        assert set(Job.objects.values_list("status", "runner")) == {("pending", "worker")}
        ran = {}

        def worker(name):
            try:
                ran[name] = background.work(burst=True, worker=name)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not barrier.broken
    assert ran["w0"] and ran["w1"] and not set(ran["w0"]) & set(ran["w1"])
    assert sorted(ran["w0"] + ran["w1"]) == sorted(ids)
    jobs = Job.objects.filter(pk__in=ids)
    assert {(j.status, j.attempts) for j in jobs} == {("completed", 1)}
    assert {j.worker for j in jobs} == {"w0", "w1"}
    assert set(Document.objects.values_list("status", flat=True)) == {"completed"}


class WorkerProcess:
    def __init__(self, tmp_path, *args, **env):
        self.log = tmp_path / "rag_worker.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "rag_worker", *args],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
                "DJANGO_RAG_TEST_EMBEDDER": "tests.embedders.FileGatedEmbedder",
                **env,
            },
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
        )

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def test_a_killed_workers_job_is_stalled_and_a_retry_completes_it(tmp_path, staff_client):
    gate = tmp_path / "open"
    config = {
        "EMBEDDER": "hashing",
        "BACKGROUND": "worker",
        "JOBS": {"STALLED_AFTER_SECONDS": 1, "HEARTBEAT_SECONDS": 0.1},
    }
    with override_settings(DJANGO_RAG=config):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job = document.job
        assert (job.status, job.runner) == ("pending", "worker")
        first = WorkerProcess(
            tmp_path, DJANGO_RAG_TEST_GATE_FILE=str(gate), DJANGO_RAG_TEST_HEARTBEAT="0.1"
        )
        try:
            wait_for(
                lambda: status(job.pk) == "running", "the worker to claim the job", log=first.log
            )
            # Alive and held at the gate: its heartbeat moves.
            beat = Job.objects.get(pk=job.pk).heartbeat_at
            wait_for(
                lambda: Job.objects.get(pk=job.pk).heartbeat_at > beat, "a heartbeat", log=first.log
            )
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(10)
        finally:
            first.stop()
        # Dead mid-job: still "running" in the table, but its heartbeat stopped.
        wait_for(lambda: background.stalled().filter(pk=job.pk).exists(), "the job to stall")
        assert status(job.pk) == "running"
        page = staff_client.get(reverse("django_rag_dashboard:jobs"), {"status": "stalled"})
        html = page.content.decode()
        assert f'id="job-{job.pk}"' in html and 'data-status="stalled"' in html
        assert f'action="{reverse("django_rag_dashboard:retry_job", args=[job.pk])}"' in html

        # Retry through the dashboard (a POST with the CSRF token), then a worker finishes it.
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(User.objects.get(username="staff"))
        url = reverse("django_rag_dashboard:retry_job", args=[job.pk])
        assert strict.post(url).status_code == 403  # no token, no retry
        response = staff_client.post(url)
        assert response.status_code == 302
        assert (status(job.pk), Job.objects.get(pk=job.pk).runner) == ("pending", "worker")
        with pytest.raises(JobNotRetryable):  # queued again already: a second retry is refused
            background.retry(Job.objects.get(pk=job.pk))
        gate.touch()
        second = WorkerProcess(tmp_path, "--burst", DJANGO_RAG_TEST_GATE_FILE=str(gate))
        try:
            assert second.process.wait(120) == 0, second.log.read_text()
        finally:
            second.stop()
    job.refresh_from_db()
    assert job.status == "completed" and job.attempts == 2, second.log.read_text()
    assert list(Document.objects.filter(source_id="pump")) == [document]
    document.refresh_from_db()
    assert document.status == "completed" and document.chunks.count() == document.chunk_count > 0
    assert f"Job {job.pk} (ingest): running." in second.log.read_text()


def test_a_job_whose_process_died_on_this_machine_is_stalled_within_seconds(tmp_path, staff_client):
    """With the default STALLED_AFTER_SECONDS (120), a job whose worker was killed on this
    machine is stalled as soon as its heartbeat is late (1.5 x HEARTBEAT_SECONDS here 2 s: 3 s),
    not two minutes later; while the worker lives, it is not."""
    gate = tmp_path / "open"
    config = {"EMBEDDER": "hashing", "BACKGROUND": "worker", "JOBS": {"HEARTBEAT_SECONDS": 2}}
    with override_settings(DJANGO_RAG=config):
        document = rag.ingest(TEXT, collection="manuals", source_id="pump", background=True)
        job = document.job
        worker = WorkerProcess(
            tmp_path, DJANGO_RAG_TEST_GATE_FILE=str(gate), DJANGO_RAG_TEST_HEARTBEAT="0.2"
        )
        try:
            wait_for(
                lambda: status(job.pk) == "running", "the worker to claim the job", log=worker.log
            )
            time.sleep(3.5)  # longer than the late heartbeat limit: a live worker keeps beating
            live = Job.objects.get(pk=job.pk)
            assert not background.is_stalled(live) and not background.stalled().exists()
            html = staff_client.get(reverse("django_rag_dashboard:jobs")).content.decode()
            assert 'data-status="running"' in html and "heartbeat " in html
            assert "after 120 s without a heartbeat, or after 3.0 s when the process" in html
            worker.process.send_signal(signal.SIGKILL)
            worker.process.wait(10)
            killed = time.monotonic()
        finally:
            worker.stop()
        wait_for(lambda: background.stalled().filter(pk=job.pk).exists(), "the job to stall")
        assert time.monotonic() - killed < 60  # noticed long before STALLED_AFTER_SECONDS
        dead = Job.objects.get(pk=job.pk)
        assert dead.status == "running" and not dead.is_stalled(120)  # only the pid says so
        assert background.is_stalled(dead) and background.retryable(dead)
        html = staff_client.get(reverse("django_rag_dashboard:jobs")).content.decode()
        assert 'data-status="stalled"' in html
        background.retry(dead)
        assert status(job.pk) == "pending"


def test_rag_worker_requeues_stalled_jobs(tmp_path):
    with override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "BACKGROUND": "worker",
            "JOBS": {"STALLED_AFTER_SECONDS": 60},
        }
    ):
        stale, fresh = (
            rag.ingest(f"Text {i} for the queue.", collection="q", background=True).job
            for i in range(2)
        )
        # As a worker that died an hour ago left it: claimed, running, silent since.
        long_ago = timezone.now() - timedelta(hours=1)
        Job.objects.filter(pk=stale.pk).update(
            status="running", worker="gone:1", heartbeat_at=long_ago, started_at=long_ago
        )
        Job.objects.filter(pk=fresh.pk).update(status="running", heartbeat_at=timezone.now())
        assert list(background.stalled()) == [Job.objects.get(pk=stale.pk)]
        out = StringIO()
        call_command("rag_worker", "--requeue-stalled", "--requeue-only", stdout=out)
        assert f"Job {stale.pk} (ingest): stalled, queued again." in out.getvalue()
        assert (status(stale.pk), status(fresh.pk)) == ("pending", "running")
        out = StringIO()
        call_command("rag_worker", "--burst", stdout=out)
        assert "ran 1 job(s)" in out.getvalue()
        assert status(stale.pk) == "completed"
        with pytest.raises(JobNotRetryable, match="not stalled"):
            background.retry(Job.objects.get(pk=stale.pk))
        # A command's own job has no task to run again.
        foreground = Job.objects.create(kind=Job.Kind.REEMBED, status="failed")
        with pytest.raises(JobNotRetryable, match="resume"):
            background.retry(foreground)


def test_retry_is_scoped_to_the_users_collections(staff_client):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        hidden, visible = (
            rag.ingest(f"Text about {name}.", collection=name, background=True).job
            for name in ("secret", "mine")
        )
    Job.objects.filter(pk__in=[hidden.pk, visible.pk]).update(status="failed", error="boom")
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "DASHBOARD": {"COLLECTIONS": lambda user: ["mine"]}}
    ):
        url = reverse("django_rag_dashboard:retry_job", args=[hidden.pk])
        assert staff_client.post(url).status_code == 404
        assert staff_client.get(url).status_code == 405
        page = staff_client.get(reverse("django_rag_dashboard:jobs")).content.decode()
        assert f'id="job-{visible.pk}"' in page and f'id="job-{hidden.pk}"' not in page
        # Retried inline (the suite's mode): the ingestion runs and completes.
        staff_client.post(reverse("django_rag_dashboard:retry_job", args=[visible.pk]))
    visible.refresh_from_db()
    assert (visible.status, visible.runner, visible.attempts) == ("completed", "inline", 1)
    assert Document.objects.get(collection__name="mine").status == "completed"
    assert status(hidden.pk) == "failed"


def test_job_results_and_times_are_formatted(staff_client):
    now = timezone.now()
    Job.objects.create(
        kind=Job.Kind.RUN_EVALUATION,
        status="completed",
        params={"collection": "c"},
        result={"run_id": 3, "metrics": {"mrr": 0.5, "recall_at_5": 0.75}},
        started_at=now - timedelta(seconds=75),
        finished_at=now,
    )
    html = staff_client.get(reverse("django_rag_dashboard:jobs")).content.decode()
    assert "<th>Run id</th><td>3</td>" in html
    assert "<th>Metrics · mrr</th><td>0.5</td>" in html
    assert "<th>Metrics · recall at 5</th><td>0.75</td>" in html
    assert "took 1 min 15 s" in html and "started " in html and "finished " in html
    assert "{&#x27;" not in html and "Retry" not in html


def test_rag_info_shows_the_mode():
    for setting, expected in [
        ("worker", "Background: worker (BACKGROUND='worker')"),
        ("auto", "Background: thread (BACKGROUND='auto')"),
    ]:
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": setting}):
            out = StringIO()
            call_command("rag_info", stdout=out)
            assert expected in out.getvalue()


def test_a_failed_queued_reembed_is_retried(failing_embedder):
    from django_rag.testing import HashingEmbedder

    rag.ingest("legacy text", collection="a", embedder=HashingEmbedder(model_name="old-model"))
    config = {"EMBEDDER": failing_embedder("legacy"), "BACKGROUND": "worker"}
    with override_settings(DJANGO_RAG=config):
        job = background.enqueue_reembed(batch_size=64)
        assert background.work(burst=True) == [job.pk]
    job.refresh_from_db()
    # The task renamed it to the re-embed it ran, counted one attempt and recorded the error.
    assert (job.kind, job.status, job.attempts) == ("reembed", "failed", 1)
    assert "provider refused" in job.error and background.task_for(job) == "reembed"
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        background.retry(job)
        assert background.work(burst=True) == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error) == ("completed", 2, "")
    assert set(Chunk.objects.values_list("embedding_model", flat=True)) == {"hashing-bow"}


def test_a_job_queued_twice_runs_once_at_a_time():
    """A retry of a job still waiting in a queue (it looks stalled: no heartbeat yet) queues it
    a second time; the runners take it with one conditional update, so its work runs once."""
    runs, entered, release = [], threading.Event(), threading.Event()

    def body(job):
        runs.append(job.pk)
        entered.set()
        release.wait(30)
        return {"ok": True}

    from django_rag import tasks

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        job = Job.objects.create(kind=Job.Kind.INGEST, params={})
        first = threading.Thread(target=lambda: tasks._run(job.pk, body))
        first.start()
        assert entered.wait(30)
        try:
            # The second delivery finds the job running with a live heartbeat: it leaves it.
            tasks._run(job.pk, body)
            assert runs == [job.pk]
        finally:
            release.set()
            first.join(30)
        assert status(job.pk) == "completed"
        # Delivered again once completed: nothing runs, and a late failure cannot undo it.
        tasks._run(job.pk, body)
        Job.objects.get(pk=job.pk).fail(RuntimeError("a late duplicate failed"))
        assert runs == [job.pk] and status(job.pk) == "completed"
    connections.close_all()


def test_the_heartbeat_stays_out_of_the_callers_transaction():
    """Inline work inside a caller's transaction beats no heartbeat: a beat on another
    connection would wait on the row that transaction holds, and the work would never end."""
    from django.db import transaction

    config = {
        "EMBEDDER": "hashing",
        "JOBS": {"HEARTBEAT_SECONDS": 0.05, "STALLED_AFTER_SECONDS": 1},
    }
    with override_settings(DJANGO_RAG=config):
        job = Job.objects.create(kind=Job.Kind.INGEST, params={}, status=Job.Status.RUNNING)
        with transaction.atomic():
            Job.objects.filter(pk=job.pk).update(error="locked by this transaction")
            with background.heartbeat(job):
                time.sleep(0.3)  # several beat intervals: none may block on the row lock
        # The block returned, and no beating thread is left waiting on the row.
        assert not [t for t in threading.enumerate() if t.name == f"django-rag-heartbeat-{job.pk}"]


def test_a_stall_limit_within_two_heartbeats_is_refused():
    from django_rag.checks import check_settings

    with override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "JOBS": {"HEARTBEAT_SECONDS": 60, "STALLED_AFTER_SECONDS": 100},
        }
    ):
        errors = check_settings()
        assert [e.id for e in errors] == ["django_rag.E005"]
        assert "STALLED_AFTER_SECONDS" in errors[0].msg and "twice" in errors[0].msg


def test_jobs_page_shows_superseded_jobs_and_offers_no_retry_that_cannot_work(staff_client):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        older, newer = (
            rag.ingest(text, collection="manuals", source_id="pump", replace=True, background=True)
            for text in ("Pump manual, first edition. " * 20, "Pump manual, second edition. " * 20)
        )
        for document in (newer, older):  # the newest runs first: the older one is overtaken
            background_runners._run_in_thread("ingest_document", document.job.pk)
        # A failed ingest whose document was deleted since, and one whose document is there.
        gone = rag.ingest("A valve note. " * 20, collection="manuals", background=True)
        kept = rag.ingest("A filter note. " * 20, collection="manuals", background=True)
        for document in (gone, kept):
            Job.objects.get(pk=document.job.pk).fail(RuntimeError("the embedder was down"))
        # Deleted behind the store's back (the store's own delete supersedes the job:
        # tests/test_ordering.py): the job stays failed, with nothing left to retry.
        Chunk.objects.filter(document_id=gone.pk).delete()
        Document.objects.filter(pk=gone.pk).delete()
        # Queued again after a transient failure: waiting for its backoff, the error kept.
        waiting = rag.ingest("A seal note. " * 20, collection="manuals", background=True)
        Job.objects.filter(pk=waiting.job.pk).update(
            error="OperationalError: the connection was lost",
            not_before=timezone.now() + timedelta(seconds=30),
        )
    assert status(older.job.pk) == "superseded" and status(newer.job.pk) == "completed"

    url = reverse("django_rag_dashboard:jobs")
    html = staff_client.get(url).content.decode()

    def row(job_id):
        start = html.index(f'id="job-{job_id}"')
        return html[start : html.index("</tr>", start)]

    def retry_form(job_id):
        return f'action="{reverse("django_rag_dashboard:retry_job", args=[job_id])}"'

    superseded = row(older.job.pk)
    assert 'data-status="superseded"' in superseded and ">Superseded<" in superseded
    assert "newer version" in superseded  # why, worded for people, not as an error
    assert 'class="error"' not in superseded
    assert retry_form(older.job.pk) not in html
    assert retry_form(gone.job.pk) not in html
    assert "No retry: its document was deleted" in row(gone.job.pk)
    assert retry_form(kept.job.pk) in html  # a failed job that can run again still can
    assert "next try at" in row(waiting.job.pk) and "connection was lost" in row(waiting.job.pk)
    assert retry_form(waiting.job.pk) not in html  # it will run by itself
    # The status filter knows the new status.
    filtered = staff_client.get(url, {"status": "superseded"}).content.decode()
    assert "<option selected>superseded</option>" in filtered
    assert f'id="job-{older.job.pk}"' in filtered
    assert f'id="job-{newer.job.pk}"' not in filtered and f'id="job-{kept.job.pk}"' not in filtered
    # A retry forced through the URL is refused with why.
    response = staff_client.post(
        reverse("django_rag_dashboard:retry_job", args=[older.job.pk]), follow=True
    )
    assert "superseded" in response.content.decode() and status(older.job.pk) == "superseded"

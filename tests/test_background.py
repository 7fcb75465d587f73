"""Background work: inline fallback (no broker) here; a real Celery worker in
test_celery_worker.py."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

import django_rag as rag
from django_rag import background
from django_rag.background import registry as background_registry
from django_rag.checks import check_settings
from django_rag.exceptions import ConfigurationError, InvalidOption
from django_rag.models import Chunk, Document, Job
from django_rag.testing import HashingEmbedder
from tests.conftest import background_default
from tests.helpers import make_pdf

pytestmark = pytest.mark.django_db


def test_modes_resolve_and_bad_ones_are_refused():
    assert background.use_celery() is False and background.mode() == "inline"  # the suite's
    for setting, resolved in [
        ("auto", "thread"),
        ("thread", "thread"),
        ("worker", "worker"),
        ("inline", "inline"),
        ("sync", "inline"),
    ]:
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": setting}):
            assert background.mode() == resolved  # no broker: auto is the thread pool
            assert background.describe()["mode"] == resolved
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "celery"}):
        with pytest.raises(ConfigurationError, match="broker_url"):
            background.use_celery()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "sometimes"}):
        with pytest.raises(ConfigurationError, match="'thread'"):
            background.use_celery()
        assert [e.id for e in check_settings()] == ["django_rag.E005"]
    for jobs in ({"THREADS": 0}, {"THREADS": 1.5}, {"STALLED_AFTER_SECONDS": "1"}, {"EVERY": 1}):
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "JOBS": jobs}):
            errors = check_settings()
            assert [e.id for e in errors] == ["django_rag.E005"], jobs
            assert "JOBS." in errors[0].msg


def test_background_ingest_inline_gives_the_same_result_as_foreground():
    text = "Background ingestion stores the same chunks. " * 30
    queued = rag.ingest(text, collection="bg", source_id="q", background=True)
    direct = rag.ingest(text, collection="fg", source_id="d")
    assert queued.status == "completed" and queued.chunk_count == direct.chunk_count
    job = Job.objects.get(kind="ingest")
    assert job.status == "completed" and job.result["chunk_count"] == queued.chunk_count
    queued_chunks = list(
        Chunk.objects.filter(document=queued)
        .order_by("chunk_index")
        .values_list("text", "start_char", "end_char")
    )
    direct_chunks = list(
        Chunk.objects.filter(document=direct)
        .order_by("chunk_index")
        .values_list("text", "start_char", "end_char")
    )
    assert queued_chunks == direct_chunks
    hits = rag.search("background ingestion chunks", collection="bg", limit=1)
    assert hits[0].document_id == queued.pk


def test_background_file_ingest_keeps_pages_and_replace():
    pdf = make_pdf(["First page about apples.", "Second page about bananas."])
    first = rag.ingest_bytes(
        pdf, filename="fruit.pdf", collection="bg", source_id="fruit", background=True
    )
    assert first.status == "completed" and first.original_filename == "fruit.pdf"
    chunk = first.chunks.get()
    assert (chunk.page_start, chunk.page_end) == (1, 2)
    second = rag.ingest(
        "Replaced text.", collection="bg", source_id="fruit", replace=True, background=True
    )
    assert list(Document.objects.filter(source_id="fruit")) == [second]
    with pytest.raises(InvalidOption, match="configured chunker and embedder"):
        rag.ingest("x", background=True, embedder=HashingEmbedder())


def test_a_failed_background_ingest_is_marked_failed(failing_embedder):
    with override_settings(DJANGO_RAG={"EMBEDDER": failing_embedder("poison")}):
        with pytest.raises(Exception, match="poison|provider refused"):
            rag.ingest("this text has poison in it", collection="bg", background=True)
    document = Document.objects.get(collection__name="bg")
    assert document.status == "failed" and "provider refused" in document.error
    assert not document.chunks.exists()
    assert Job.objects.get(kind="ingest").status == "failed"


def test_reembed_async_runs_inline_without_a_broker():
    rag.ingest("legacy", collection="a", embedder=HashingEmbedder(model_name="old-model"))
    out = StringIO()
    call_command("rag_reembed", "--async", stdout=out)
    job = Job.objects.get()
    assert f"Queued re-embedding as job {job.pk}." in out.getvalue()
    assert job.kind == "reembed" and job.status == "completed" and job.done == 1
    assert job.params["options"]["batch_size"] == 64


def test_evaluation_task_inline():
    from django_rag import tasks
    from django_rag.evaluation import create_test_case

    doc = rag.ingest("Refunds take 14 days.", collection="ev")
    create_test_case("refunds", chunks=list(doc.chunks.all()), collection="ev")
    job = Job.objects.create(kind="evaluation", params={"mode": "fulltext", "collection": "ev"})
    background.enqueue("run_evaluation", job)
    job.refresh_from_db()
    assert job.status == "completed" and job.result["metrics"]["mrr"] == 1.0
    assert (job.done, job.total) == (1, 1)
    tasks.run_evaluation(job_id=job.pk)  # idempotent: a completed job is left alone


@pytest.fixture
def unreachable_broker(tmp_path):
    """A Celery app pointed at a Redis socket nobody listens on."""
    from tests.celery_app import app

    app.conf.broker_url = f"redis+socket://{tmp_path / 'nobody.sock'}"
    app.conf.task_publish_retry = False
    app._after_fork()  # no pooled connection to an earlier broker
    with background_default("auto"):
        assert background.use_celery()
        yield app
    app.conf.broker_url = None
    app.conf.task_publish_retry = True
    app._after_fork()


@pytest.mark.django_db(transaction=True)  # tasks are sent when the transaction commits
def test_a_broker_that_cannot_be_reached_leaves_nothing_pending(unreachable_broker, client):
    from django.contrib.auth.models import User
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.urls import reverse

    from django_rag.exceptions import BackgroundUnavailable

    with pytest.raises(BackgroundUnavailable, match="BACKGROUND"):
        rag.ingest("Queued while the broker is down.", collection="down", background=True)
    assert not Document.objects.exists()
    assert Job.objects.get(kind="ingest").status == "failed"
    # The dashboard's upload shows the error instead of answering 500.
    client.force_login(User.objects.create_user("s", password="pw", is_staff=True))
    response = client.post(
        reverse("django_rag_dashboard:upload"),
        {"file": SimpleUploadedFile("a.txt", b"Refunds."), "collection": "down"},
        follow=True,
    )
    assert response.status_code == 200 and "broker" in response.content.decode()
    assert not Document.objects.exists()


def test_every_job_kind_names_its_task_in_one_table(db):
    """One spelling per job kind: TASK_FOR_KIND declares the task of every kind (no name
    derived by replacing dashes), every registered task runs some kind, and start() creates
    the kind the table gives (an unknown task is refused, naming the tasks)."""
    import django_rag.tasks  # noqa: F401  (registers the tasks)

    assert set(background.TASK_FOR_KIND) == set(Job.Kind)
    assert set(background.TASK_FOR_KIND.values()) == set(background_registry.TASKS)
    for kind in Job.Kind:
        job = Job(kind=kind, runner=background.THREAD)
        assert background.task_for(job) == background.TASK_FOR_KIND[kind]
    assert background.KIND_FOR_TASK["ingest_document"] == Job.Kind.INGEST
    with pytest.raises(ValueError, match="tasks: build_graph"):
        background.start("build-graph")

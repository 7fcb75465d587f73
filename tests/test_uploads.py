"""Uploads are stored by the request and parsed by their job, in a child process whose memory
is limited: the web process never parses them. Every upload has a source id (the file name by
default), so *Replace* works from the dashboard."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import override_settings
from django.urls import reverse

import django_rag as rag
from django_rag import background
from django_rag.exceptions import DocumentTooLarge
from django_rag.ingestion.isolation import parse_isolated
from django_rag.ingestion.parsers import ParsedDocument, Parser
from django_rag.models import Document, Job, Upload
from tests.helpers import make_pdf
from tests.test_parsers_hostile import cmap_bomb_pdf

ROOT = Path(__file__).resolve().parent.parent
UPLOAD = reverse("django_rag_dashboard:upload")


def post(client, name, data, **fields):
    return client.post(
        UPLOAD, {"collection": "uploads", "file": SimpleUploadedFile(name, data), **fields}
    )


class PidParser(Parser):
    """Text naming the process that parsed it."""

    content_type = "text/plain"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        return ParsedDocument(text=f"parsed by process {os.getpid()}: {data.decode()}")


# --- where the upload is parsed -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_request_stores_the_upload_and_the_job_parses_it(staff):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "worker"}):
        response = post(staff, "manual.pdf", make_pdf(["Press the red button."]))
        job = Job.objects.get(kind="ingest")
        assert response.status_code == 302 and response["Location"].endswith(f"?job={job.pk}")
        document = Document.objects.get(pk=job.params["document_id"])
        # Nothing parsed yet: the document waits with the file's bytes.
        assert (document.status, document.content, document.chunk_count) == ("pending", "", 0)
        assert bytes(Upload.objects.get(document=document).data).startswith(b"%PDF")
        assert background.work(burst=True) == [job.pk]
    document.refresh_from_db()
    assert document.status == "completed" and "Press the red button." in document.content
    assert document.content_type == "application/pdf" and document.metadata["page_count"] == 1
    assert document.chunks.count() == document.chunk_count > 0
    assert not Upload.objects.exists()  # the bytes go once the document is stored
    assert rag.search("red button", mode="fulltext", collection="uploads")[0].document_id == (
        document.pk
    )


@pytest.mark.django_db
def test_the_job_parses_in_a_child_process_even_inline(staff, settings):
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "PARSERS": {".txt": "tests.test_uploads.PidParser"},
    }
    post(staff, "note.txt", b"refunds take 14 days")
    document = Document.objects.get(original_filename="note.txt")
    assert document.status == "completed"
    parser_pid = int(document.content.split("process ")[1].split(":")[0])
    assert parser_pid != os.getpid()  # inline: the job ran in this process, the parse did not
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "MAX_PARSE_MEMORY": None}
    assert str(os.getpid()) in parse_isolated(b"x", filename="x.txt").text  # opted out


@pytest.mark.django_db
def test_the_cmap_bomb_upload_returns_and_fails_its_job_with_the_budget_error(staff):
    started = time.process_time()
    response = post(staff, "bomb.pdf", cmap_bomb_pdf(), replace="on")
    assert time.process_time() - started < 5  # 10+ GB and 80+ s when the request parsed it
    assert response.status_code == 302
    job = Job.objects.get(kind="ingest")
    document = Document.objects.get(pk=job.params["document_id"])
    assert job.status == "failed" and document.status == "failed"
    assert job.error.startswith("DocumentTooLarge: bomb.pdf: page 1")
    assert "MAX_PDF_PAGE_CONTENT_BYTES" in job.error and "128 characters" in job.error
    assert document.error == job.error
    assert Upload.objects.filter(document=document).exists()  # kept for a retry
    messages = staff.get(response["Location"]).content.decode()
    assert "MAX_PDF_PAGE_CONTENT_BYTES" in messages


@pytest.mark.django_db
def test_what_no_budget_foresees_stops_at_max_parse_memory(staff, settings):
    """With the page budget off, the CMap bomb's extraction runs: the child reaches its
    address-space limit and the job fails with a typed error (the web process is untouched)."""
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "MAX_PDF_PAGE_CONTENT_BYTES": None,
        "MAX_PARSE_MEMORY": 256 * 1024 * 1024,
    }
    post(staff, "bomb.pdf", cmap_bomb_pdf())
    job = Job.objects.get(kind="ingest")
    assert job.status == "failed"
    assert job.error.startswith("DocumentTooLarge: bomb.pdf: reading it needed more than")
    assert "MAX_PARSE_MEMORY (268,435,456 bytes)" in job.error


@pytest.mark.django_db
def test_a_parse_past_parse_timeout_is_stopped(settings, monkeypatch):
    from django_rag.ingestion import isolation

    monkeypatch.setattr(isolation, "GRACE_SECONDS", 0)
    settings.DJANGO_RAG = {"PARSE_TIMEOUT": 0.5, "PARSERS": {".txt": "tests.test_uploads.Sleeper"}}
    started = time.monotonic()
    with pytest.raises(DocumentTooLarge, match="PARSE_TIMEOUT") as info:
        parse_isolated(b"x", filename="slow.txt")
    assert info.value.details["setting"] == "PARSE_TIMEOUT"
    assert time.monotonic() - started < 30


class Sleeper(Parser):
    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        time.sleep(600)  # stuck inside one page, out of the parser's own checks
        raise AssertionError("not stopped")


# --- the web process's memory, measured in a fresh process -------------------------------------

WEB = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY))  # a fence
import django
django.setup()
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings
from django_rag.models import Job
from tests.test_parsers_hostile import cmap_bomb_pdf
client = Client()
client.force_login(User.objects.create_user("web", password="pw", is_staff=True))
config = {"EMBEDDER": "hashing", "BACKGROUND": "inline", "MAX_PDF_PAGE_CONTENT_BYTES": None,
          "MAX_PARSE_MEMORY": 512 * 1024 * 1024}
with override_settings(DJANGO_RAG=config):
    file = SimpleUploadedFile("bomb.pdf", cmap_bomb_pdf())
    response = client.post("/tools/rag/documents/upload/", {"collection": "web", "file": file})
job = Job.objects.get(kind="ingest")
print(json.dumps({
    "status": response.status_code,
    "job": job.status,
    "error": job.error,
    "peak_mb": next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")
    ) / 1024,
}))
"""


@pytest.mark.django_db(transaction=True)
def test_the_web_process_memory_stays_bounded():
    """The request of a web process (a fresh one, so its peak is its own) takes the CMap bomb
    with the page budget off and BACKGROUND="inline": the parse happens in the job's child,
    which stops at MAX_PARSE_MEMORY; the web process stays near its start-up size."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", WEB], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"web process peak: {result['peak_mb']:.0f} MB")  # docs/benchmarks.md
    assert result["status"] == 302 and result["job"] == "failed"
    assert "MAX_PARSE_MEMORY" in result["error"]
    assert result["peak_mb"] < 400


# --- source ids and Replace ------------------------------------------------------------------


@pytest.mark.django_db
def test_replace_from_the_dashboard_keeps_one_document_with_the_new_text(staff):
    post(staff, "a.txt", b"The first version of the refund policy.")
    first = Document.objects.get()
    assert first.source_id == "a.txt" and first.status == "completed"
    response = post(staff, "a.txt", b"The second version: refunds take 14 days.", replace="on")
    assert response.status_code == 302
    document = Document.objects.get()  # one document: the new version replaced the first
    assert document.pk != first.pk and document.source_id == "a.txt"
    assert document.content == "The second version: refunds take 14 days."
    assert Job.objects.filter(status="failed").count() == 0
    # A typed source id wins over the file's name.
    post(staff, "b.txt", b"Other text.", source_id="policies/b")
    assert Document.objects.get(original_filename="b.txt").source_id == "policies/b"
    # The same file again, with or without Replace: the stored document, not a copy.
    post(staff, "a.txt", b"The second version: refunds take 14 days.")
    post(staff, "a.txt", b"The second version: refunds take 14 days.", replace="on")
    assert list(Document.objects.filter(source_id="a.txt")) == [document]
    document = rag.ingest_bytes(
        b"The second version: refunds take 14 days.",
        filename="a.txt",
        collection="uploads",
        source_id="a.txt",
        background=True,
    )
    assert document.deduplicated and document.pk == Document.objects.get(source_id="a.txt").pk


@pytest.mark.django_db
def test_upload_errors_are_worded_for_the_form(staff):
    def errors(**fields):
        fields = {"collection": "uploads", "file": SimpleUploadedFile("a.txt", b"t"), **fields}
        return staff.post(UPLOAD, fields, follow=True).content.decode()

    page = errors(source_id="s" * 513, replace="on")
    assert "at most 512 characters" in page and "replace=True" not in page
    page = errors(collection="\u200b")  # nothing visible
    assert "Enter a collection name" in page and "got &#x27;" not in page
    assert not Document.objects.exists()
    # Django keeps upload names to 255 characters, so the file name always fits a source id.
    post(staff, "x" * 600 + ".txt", b"long name", replace="on")
    assert len(Document.objects.get().source_id) == 255


@pytest.mark.django_db
def test_a_failed_upload_job_is_retried_from_its_stored_bytes(staff, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "MAX_DOCUMENT_CHARS": 10}
    post(staff, "long.txt", b"More than ten characters of text.")
    job = Job.objects.get(kind="ingest")
    assert job.status == "failed" and "MAX_DOCUMENT_CHARS" in job.error
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}  # the budget raised: Retry parses again
    background.retry(job)
    job.refresh_from_db()
    document = Document.objects.get(pk=job.params["document_id"])
    assert (job.status, document.status) == ("completed", "completed")
    assert document.content == "More than ten characters of text." and document.error == ""
    assert not Upload.objects.exists()

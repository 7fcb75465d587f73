"""The real fixture files of each format go in through every entry point (``ingest_file``,
``rag_ingest`` and the dashboard upload, whose job parses in the memory-limited child) and
come out stored: text, title, metadata, page (slide, sheet) ranges on the chunks, and found by
full-text search."""

from __future__ import annotations

import shutil
from importlib.util import find_spec
from io import StringIO
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

import django_rag as rag
from django_rag.models import Document

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"

# file, module its extra installs, words the stored text holds, a query, title, page count
CASES = [
    (
        "saved_page.html",
        "trafilatura",
        ["## Refund amounts", "| Lightly ridden | 90 percent | 7 days |"],
        "derailleur foam sleeve",
        "Returning a bicycle",
        None,
    ),
    (
        "expense_policy.docx",
        "docx",
        ["## What is not reimbursed", "| Zurich | 210 CHF | 70 CHF |"],
        "Zurich hotel",
        "Travel expense policy",
        None,
    ),
    (
        "quarterly_review.pptx",
        "pptx",
        ["## Tickets by channel", "| Email | 1,204 |"],
        "northern region revenue",
        "Quarterly review",
        3,
    ),
    (
        "stock.xlsx",
        "openpyxl",
        ["## Suppliers", "| Costa Cycles | Portugal | 35 |"],
        "tubeless tyre",
        "Warehouse stock",
        2,
    ),
    (
        "cooling_failure.eml",
        "pymupdf",
        ["## Attachment: incident-report.pdf", "From: Dana Reyes"],
        "compressor replacement",
        "Cooling failure in hall B",
        None,
    ),
]
IDS = [case[0] for case in CASES]


def installed(module: str) -> None:
    if find_spec(module) is None:
        pytest.skip(f"{module} (an optional extra) is not installed")


def check_stored(document: Document, words, query, title, pages) -> None:
    assert document.status == "completed", document.error
    for text in words:
        assert text in document.content
    assert document.title == title
    chunks = list(document.chunks.order_by("chunk_index"))
    assert chunks and all(document.content[c.start_char : c.end_char] == c.text for c in chunks)
    if pages is None:
        assert all(chunk.page_start is None for chunk in chunks)
    else:
        assert chunks[0].page_start == 1 and chunks[-1].page_end == pages
    hits = rag.search(query, mode="fulltext", collection=document.collection.name)
    assert hits and hits[0].document_id == document.pk


@pytest.mark.django_db
@pytest.mark.parametrize("name, module, words, query, title, pages", CASES, ids=IDS)
def test_ingest_file_stores_each_format(settings, name, module, words, query, title, pages):
    installed(module)
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    # Small chunks, so the page ranges of several chunks are checked.
    document = rag.ingest_file(FIXTURES / name, collection="formats", chunk_size=60)
    check_stored(document, words, query, title, pages)
    assert document.content_type != "application/octet-stream"


@pytest.mark.django_db
@pytest.mark.parametrize("name, module, words, query, title, pages", CASES, ids=IDS)
def test_the_dashboard_upload_parses_each_format_in_its_job(
    staff, settings, name, module, words, query, title, pages
):
    installed(module)
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    upload = SimpleUploadedFile(name, (FIXTURES / name).read_bytes())
    response = staff.post(
        reverse("django_rag_dashboard:upload"), {"collection": "uploads", "file": upload}
    )
    assert response.status_code == 302
    check_stored(Document.objects.get(original_filename=name), words, query, title, pages)


@pytest.mark.django_db
def test_rag_ingest_reads_a_folder_of_every_format(settings, tmp_path):
    for case in CASES:
        installed(case[1])
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in IDS:
        shutil.copy(FIXTURES / name, folder / name)
    (folder / "rain.csv").write_text("city,rain (mm)\nBergen,2250\nLisbon,690\n")
    out = StringIO()
    call_command("rag_ingest", str(folder), "--collection", "mixed", stdout=out)
    assert "6 file(s): 6 ingested" in out.getvalue(), out.getvalue()
    stored = {d.original_filename: d for d in Document.objects.filter(collection__name="mixed")}
    assert set(stored) == {*IDS, "rain.csv"}
    assert "| Bergen | 2250 |" in stored["rain.csv"].content
    for name, _module, words, query, title, pages in CASES:
        check_stored(stored[name], words, query, title, pages)

"""Scanned PDF pages: read by OCR when an engine is installed, reported page by page when not."""

import shutil
import time

import pytest
from django.test import override_settings
from django.urls import reverse

import django_rag as rag
from django_rag.exceptions import MissingDependency, NoTextLayer
from django_rag.ingestion import ocr
from django_rag.ingestion.isolation import parse_isolated
from django_rag.ingestion.parsers import parse_bytes
from django_rag.models import Chunk

pymupdf = pytest.importorskip("pymupdf")
pytestmark = pytest.mark.django_db

LINES = ["Quarterly invoice reconciliation", "Warehouse inventory audit"]
needs_rapidocr = pytest.mark.skipif(
    not ocr.has_rapidocr(), reason="rapidocr-onnxruntime (the ocr extra) is not installed"
)


def scanned_page(document, lines) -> None:
    """Append a page whose only content is an image of ``lines`` (no text layer)."""
    source = pymupdf.open()
    page = source.new_page(width=595, height=842)
    for n, line in enumerate(lines):
        page.insert_text((60, 120 + 60 * n), line, fontsize=26)
    pixmap = page.get_pixmap(dpi=110)
    scan = document.new_page(width=595, height=842)
    scan.insert_image(scan.rect, pixmap=pixmap)


def make_pdf(*pages) -> bytes:
    """Pages are ``("text", str)`` (a text layer) or ``("scan", [lines])`` (an image)."""
    document = pymupdf.open()
    for kind, content in pages:
        if kind == "scan":
            scanned_page(document, content)
        else:
            document.new_page().insert_text((72, 72), content, fontsize=11)
    data = document.tobytes()
    assert all(not p.get_text().strip() for p in pymupdf.open(stream=data) if p.get_images())
    return data


OFF = {"EMBEDDER": "hashing", "OCR": "off"}


def test_without_ocr_a_scanned_page_is_reported_by_number(tmp_path):
    path = tmp_path / "mixed.pdf"
    path.write_bytes(
        make_pdf(("text", "Typed cover page."), ("scan", LINES), ("text", "Typed last page."))
    )
    with override_settings(DJANGO_RAG=OFF):
        document = rag.ingest_file(path, collection="scans")
    assert document.metadata["pages_without_text"] == [2]
    [warning] = document.metadata["parse_warnings"]
    assert warning.startswith("page 2: scanned image without a text layer, not read")
    assert "'off'" in warning
    assert "ocr_pages" not in document.metadata
    assert "Typed last page." in document.content


def test_without_an_engine_installed_the_warning_says_what_to_install(monkeypatch):
    monkeypatch.setattr(ocr, "has_rapidocr", lambda: False)
    monkeypatch.setattr(ocr.shutil, "which", lambda name: None)
    data = make_pdf(("scan", LINES), ("scan", LINES), ("text", "Typed."), ("scan", LINES))
    parsed = parse_bytes(data, filename="three.pdf")
    assert parsed.metadata["pages_without_text"] == [1, 2, 4]
    [warning] = parsed.metadata["parse_warnings"]
    assert warning.startswith("pages 1-2, 4: scanned image without a text layer, not read")
    assert "pip install 'django-rag[ocr]'" in warning
    # A PDF with nothing but scans fails, naming the pages and the fix.
    with pytest.raises(NoTextLayer, match=r"pages 1-2.*django-rag\[ocr\]") as caught:
        parse_bytes(make_pdf(("scan", LINES), ("scan", LINES)), filename="scan.pdf")
    assert caught.value.details["pages_without_text"] == [1, 2]
    with pytest.raises(MissingDependency, match="rapidocr-onnxruntime"):
        ocr.engine_name("rapidocr")


def test_a_blank_page_is_neither_read_nor_reported():
    document = pymupdf.open()
    document.new_page().insert_text((72, 72), "Only page with words.")
    document.new_page()  # blank: no text, no image
    parsed = parse_bytes(document.tobytes(), filename="blank.pdf")
    assert "pages_without_text" not in parsed.metadata


def test_the_dashboard_document_page_shows_the_pages_not_read(staff, tmp_path):
    path = tmp_path / "mixed.pdf"
    path.write_bytes(make_pdf(("text", "Typed cover page."), ("scan", LINES)))
    with override_settings(DJANGO_RAG=OFF):
        document = rag.ingest_file(path, collection="scans")
    body = staff.get(reverse("django_rag_dashboard:document", args=[document.pk])).content
    body = body.decode()
    assert 'id="parse-warnings"' in body
    assert "page 2: scanned image without a text layer, not read" in body


def test_the_time_budget_stops_ocr_before_it_is_spent():
    pages = ocr.ScannedPages("x.pdf", started=time.monotonic() - 59.5, timeout=60)
    pages.engine = "rapidocr"
    pages.slowest = 2.0  # the last page took longer than what is left
    assert pages._refusal() == "PARSE_TIMEOUT nearly spent"
    pages.unread[3] = pages._refusal()
    assert "raise DJANGO_RAG['PARSE_TIMEOUT']" in pages.metadata()["parse_warnings"][0]
    roomy = ocr.ScannedPages("x.pdf", started=time.monotonic(), timeout=60)
    roomy.engine = "rapidocr"
    assert roomy._refusal() == ""


def test_a_huge_page_is_rendered_within_the_pixel_budget():
    document = pymupdf.open()
    page = document.new_page(width=14_400, height=14_400)  # 200 x 200 inches
    pages = ocr.ScannedPages("x.pdf", started=time.monotonic(), timeout=None)
    pixmap = pymupdf.Pixmap(pages._render(page))
    assert pixmap.width * pixmap.height <= ocr.MAX_PIXELS


@needs_rapidocr
def test_a_scanned_page_is_read_by_rapidocr_and_searchable(tmp_path):
    path = tmp_path / "mixed.pdf"
    path.write_bytes(make_pdf(("text", "Typed cover page."), ("scan", LINES)))
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "OCR": "rapidocr"}):
        document = rag.ingest_file(path, collection="scans")
    text = document.content.casefold()
    for word in ("quarterly", "invoice", "reconciliation", "warehouse", "inventory", "audit"):
        assert word in text, document.content
    assert document.metadata["ocr_pages"] == [2]
    assert document.metadata["ocr_engine"] == "rapidocr"
    assert "pages_without_text" not in document.metadata
    [hit] = rag.search("warehouse inventory", mode="fulltext", collection="scans", limit=1)
    chunk = Chunk.objects.get(pk=hit.chunk_id)
    assert chunk.page_end == 2


@needs_rapidocr
def test_ocr_runs_in_the_memory_limited_parse_child():
    data = make_pdf(("scan", LINES))
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "OCR": "auto"}):
        parsed = parse_isolated(data, filename="scan.pdf")
    assert "invoice" in parsed.text.casefold()
    assert parsed.metadata["ocr_pages"] == [1]


@needs_rapidocr
def test_ocr_max_pages_leaves_the_rest_listed():
    data = make_pdf(("scan", LINES), ("scan", ["Second scanned page"]))
    settings = {"EMBEDDER": "hashing", "OCR": "rapidocr", "OCR_MAX_PAGES": 1}
    with override_settings(DJANGO_RAG=settings):
        parsed = parse_bytes(data, filename="two.pdf")
    assert parsed.metadata["ocr_pages"] == [1]
    assert parsed.metadata["pages_without_text"] == [2]
    assert "OCR_MAX_PAGES (1)" in parsed.metadata["parse_warnings"][0]


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="the tesseract program is absent")
def test_tesseract_reads_a_scanned_page():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "OCR": "tesseract"}):
        parsed = parse_bytes(make_pdf(("scan", LINES)), filename="scan.pdf")
    assert "invoice" in parsed.text.casefold()
    assert parsed.metadata["ocr_engine"] == "tesseract"


SAMPLE = (
    __import__("pathlib").Path(__file__).parent.parent
    / "../shared/data/pdfs/scanned_image_only_no_text_layer.pdf"
)


@needs_rapidocr
@pytest.mark.skipif(not SAMPLE.exists(), reason="needs ../shared/data/pdfs")
def test_the_real_scanned_sample_is_read():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "OCR": "rapidocr"}):
        parsed = parse_bytes(SAMPLE.read_bytes(), filename=SAMPLE.name)
    assert "docling" in parsed.text.casefold() and "markdown" in parsed.text.casefold()
    assert parsed.metadata["ocr_pages"] == [1]

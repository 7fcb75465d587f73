"""The office, web and mail formats: HTML, DOCX, PPTX, XLSX, CSV and EML. Files are made here
with the same libraries that read them (python-docx, python-pptx, openpyxl, the email
package), and a few real ones live in tests/fixtures/formats. Each test asserts the text,
its structure (Markdown headings and tables), the metadata and the page (slide, sheet) spans."""

from __future__ import annotations

from pathlib import Path

import pytest

import django_rag as rag
from django_rag.exceptions import DocumentTooLarge, EmptyDocument
from django_rag.ingestion.parsers import get_parser, parse_bytes, parse_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"


def page_texts(parsed) -> list[str]:
    return [parsed.text[page.start : page.end] for page in parsed.pages]


# --- HTML --------------------------------------------------------------------------------------

pytest.importorskip("trafilatura", reason="the html extra (trafilatura) is not installed")


def test_a_saved_page_keeps_its_article_and_drops_the_site_around_it():
    parsed = parse_file(FIXTURES / "saved_page.html")
    assert parsed.title == "Returning a bicycle"
    assert parsed.format == "markdown" and parsed.content_type == "text/html"
    assert parsed.metadata["author"] == "Velo Works Support"
    text = parsed.text
    # Headings as Markdown structure, in order.
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings == [
        "# Returning a bicycle",
        "## Packing the bicycle",
        "## Refund amounts",
        "### Custom builds",
    ]
    # A link's text stays in its sentence; its address does not.
    assert "Read our terms of sale for the details" in " ".join(text.split())
    assert "/terms" not in text
    # The table is a table, header first.
    assert "| Condition | Refund | Processing time |\n|---|---|---|" in text
    assert "| Lightly ridden | 90 percent | 7 days |" in text
    assert "1. Print the return label from your account." in text
    # Navigation, banner, breadcrumbs, sidebar, footer, scripts and styles are gone.
    for boilerplate in (
        "Shop all bikes",
        "Free shipping",
        "Privacy policy",
        "newsletter",
        "Related articles",
        "tracking pixel",
        "font-family",
        "All rights reserved",
    ):
        assert boilerplate not in text


def test_an_html_page_in_another_charset_is_read_by_its_declaration():
    page = (
        '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head><body><article>'
        "<h1>Caf\xe9 cr\xe8me</h1><p>"
        + "Le caf\xe9 cr\xe8me est servi \xe0 la terrasse tous les matins. " * 5
        + "</p></article></body></html>"
    ).encode("latin-1")
    parsed = parse_bytes(page, filename="cafe.html")
    assert parsed.title == "Caf\xe9 cr\xe8me" and "Le caf\xe9 cr\xe8me est servi" in parsed.text


def test_an_html_file_with_nothing_readable_is_a_typed_error():
    with pytest.raises(EmptyDocument, match="no readable text"):
        parse_bytes(
            b"<html><head><script>x()</script></head><body></body></html>", filename="a.htm"
        )


def test_rich_text_is_ingested_with_format_html_and_found_by_its_words(db, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    html = (
        "<p>Our <b>loyalty</b> programme gives a <a href='/x'>free espresso</a> every tenth "
        "visit.</p><h2>Conditions</h2><ul><li>One stamp per day</li></ul>"
        "<script>steal()</script><style>p{}</style>"
    )
    document = rag.ingest(html, collection="cms", format="html", source_id="page-1")
    assert document.content_type == "text/html"
    assert document.content == (
        "Our **loyalty** programme gives a free espresso every tenth visit.\n\n"
        "## Conditions\n\n- One stamp per day"
    )
    hits = rag.search("espresso stamp", mode="fulltext", collection="cms")
    assert hits and hits[0].document_id == document.pk
    # Unchanged HTML is recognised as the same document.
    assert rag.ingest(html, collection="cms", format="html", source_id="page-1").pk == document.pk


def test_the_html_parser_is_registered_for_both_extensions():
    assert type(get_parser("a.html")).__name__ == type(get_parser("b.HTM")).__name__ == "HtmlParser"


def test_html_markup_beyond_the_character_budget_is_refused_unread(settings):
    settings.DJANGO_RAG = {"MAX_DOCUMENT_CHARS": 1000}
    with pytest.raises(DocumentTooLarge) as caught:
        parse_bytes(b"<p>" + b"x" * 5000 + b"</p>", filename="big.html")
    assert caught.value.details["setting"] == "MAX_DOCUMENT_CHARS"

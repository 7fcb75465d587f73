"""The office, web and mail formats: HTML, DOCX, PPTX, XLSX, CSV and EML. Files are made here
with the same libraries that read them (python-docx, python-pptx, openpyxl, the email
package), and a few real ones live in tests/fixtures/formats. Each test asserts the text,
its structure (Markdown headings and tables), the metadata and the page (slide, sheet) spans."""

from __future__ import annotations

import io
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

import django_rag as rag
from django_rag.exceptions import CorruptFile, DocumentTooLarge, EmptyDocument
from django_rag.ingestion.parsers import get_parser, parse_bytes, parse_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"


def needs(module: str, extra: str):
    return pytest.mark.skipif(
        find_spec(module) is None, reason=f"the {extra} extra ({module}) is not installed"
    )


html = needs("trafilatura", "html")
docx_extra = needs("docx", "docx")
pptx_extra = needs("pptx", "pptx")
xlsx_extra = needs("openpyxl", "xlsx")


def page_texts(parsed) -> list[str]:
    return [parsed.text[page.start : page.end] for page in parsed.pages]


# --- HTML --------------------------------------------------------------------------------------


@html
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


@html
def test_an_html_page_in_another_charset_is_read_by_its_declaration():
    page = (
        '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head><body><article>'
        "<h1>Caf\xe9 cr\xe8me</h1><p>"
        + "Le caf\xe9 cr\xe8me est servi \xe0 la terrasse tous les matins. " * 5
        + "</p></article></body></html>"
    ).encode("latin-1")
    parsed = parse_bytes(page, filename="cafe.html")
    assert parsed.title == "Caf\xe9 cr\xe8me" and "Le caf\xe9 cr\xe8me est servi" in parsed.text


@html
def test_an_html_file_with_nothing_readable_is_a_typed_error():
    with pytest.raises(EmptyDocument, match="no readable text"):
        parse_bytes(
            b"<html><head><script>x()</script></head><body></body></html>", filename="a.htm"
        )


@html
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


@html
def test_the_html_parser_is_registered_for_both_extensions():
    assert type(get_parser("a.html")).__name__ == type(get_parser("b.HTM")).__name__ == "HtmlParser"


@html
def test_html_markup_beyond_the_character_budget_is_refused_unread(settings):
    settings.DJANGO_RAG = {"MAX_DOCUMENT_CHARS": 1000}
    with pytest.raises(DocumentTooLarge) as caught:
        parse_bytes(b"<p>" + b"x" * 5000 + b"</p>", filename="big.html")
    assert caught.value.details["setting"] == "MAX_DOCUMENT_CHARS"


# --- DOCX --------------------------------------------------------------------------------------


def make_docx(build) -> bytes:
    import docx

    document = docx.Document()
    build(document)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


@docx_extra
def test_a_word_file_keeps_headings_lists_and_its_table():
    parsed = parse_file(FIXTURES / "expense_policy.docx")
    assert parsed.title == "Travel expense policy"
    assert parsed.format == "markdown" and parsed.content_type.endswith("document")
    assert parsed.metadata["author"] == "Finance Team"
    assert parsed.metadata["created"].startswith("2025-03-01T09:30")
    assert parsed.pages == []  # Word files have no fixed pages
    assert parsed.text == (
        "# Travel expense policy\n\n"
        "Employees travelling for work are reimbursed for reasonable costs. Keep every receipt "
        "and file the claim within thirty days of returning.\n\n"
        "# Allowances\n\n"
        "Daily allowances depend on the destination city.\n\n"
        "| City | Hotel per night | Meals per day |\n"
        "|---|---|---|\n"
        "| Berlin | 140 EUR | 45 EUR |\n"
        "| Lisbon | 120 EUR | 40 EUR |\n"
        "| Zurich | 210 CHF | 70 CHF |\n\n"
        "## What is not reimbursed\n\n"
        "- Minibar purchases\n"
        "- Upgrades to business class\n"
        "  - Fines for parking or speeding\n\n"
        "## Filing a claim\n\n"
        "1. Scan the receipts.\n"
        "1. Attach them to the claim form."
    )
    # Headers and footers are left out by default...
    assert "CONFIDENTIAL" not in parsed.text and "revision 7" not in parsed.text


@docx_extra
def test_headers_and_footers_are_read_when_asked_for(settings):
    settings.DJANGO_RAG = {
        "PARSERS": {".docx": "tests.test_formats.DocxWithHeaders"},
    }
    parsed = parse_file(FIXTURES / "expense_policy.docx")
    assert parsed.text.startswith("CONFIDENTIAL - internal use only\n\n# Travel expense policy")
    assert parsed.text.endswith("Page footer: revision 7")


if find_spec("docx") is not None:
    from django_rag.ingestion.parsers.docx import DocxParser

    class DocxWithHeaders(DocxParser):
        def __init__(self):
            super().__init__(include_headers_footers=True)


@docx_extra
def test_table_cells_with_pipes_line_breaks_and_merges_stay_one_row_each():
    def build(document):
        table = document.add_table(rows=3, cols=3)
        for cell, text in zip(table.rows[0].cells, ["Key", "Value", "Note"], strict=True):
            cell.text = text
        table.cell(1, 0).text = "a|b"
        table.cell(1, 1).text = "first line\nsecond line"
        table.cell(1, 2).text = "back\\slash"
        merged = table.cell(2, 0).merge(table.cell(2, 2))
        merged.text = "spans all"

    text = parse_bytes(make_docx(build), filename="t.docx").text
    assert text.splitlines() == [
        "| Key | Value | Note |",
        "|---|---|---|",
        "| a\\|b | first line second line | back\\slash |",
        "| spans all | spans all | spans all |",
    ]


@docx_extra
def test_an_empty_word_file_stores_nothing_and_says_so(db, settings, tmp_path):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    path = tmp_path / "empty.docx"
    path.write_bytes(make_docx(lambda document: None))
    with pytest.raises(EmptyDocument):
        rag.ingest_file(path, collection="docs")


@docx_extra
def test_a_file_that_is_not_a_word_document_is_a_typed_error():
    with pytest.raises(CorruptFile, match="not a ZIP archive"):
        parse_bytes(b"this is plain text", filename="fake.docx")
    from tests.test_formats_hostile import zip_with

    with pytest.raises(CorruptFile, match="lacks word/document.xml"):
        parse_bytes(zip_with({"hello.txt": b"hi"}), filename="other.docx")


# --- XLSX and CSV ------------------------------------------------------------------------------


@xlsx_extra
def test_a_workbook_is_one_section_per_sheet_with_its_header_row():
    parsed = parse_file(FIXTURES / "stock.xlsx")
    assert parsed.title == "Warehouse stock"
    assert parsed.metadata == {"sheets": ["Stock", "Suppliers"], "author": "Logistics"}
    assert [page.number for page in parsed.pages] == [1, 2]
    stock, suppliers = page_texts(parsed)
    assert stock == (
        "## Stock\n\n"
        "| SKU | Product | Quantity | Last counted |\n"
        "|---|---|---|---|\n"
        "| B-100 | Road bike frame | 12 | 2026-02-03 |\n"
        "| B-200 | Carbon fork | 4 | 2026-02-05 |\n"
        "| T-310 | Tubeless tyre 28mm | 150 | 2026-01-30 |"
    )
    assert suppliers.startswith("## Suppliers\n\n| Supplier | Country | Lead time (days) |")
    assert "| Costa Cycles | Portugal | 35 |" in suppliers
    # A word from the second sheet maps to page (sheet) 2.
    at = parsed.text.index("Alpenrad")
    assert parsed.page_range(at, at + 8) == (2, 2)


def make_xlsx(sheets: dict[str, list[list]]) -> bytes:
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for name, rows in sheets.items():
        sheet = workbook.create_sheet(name)
        for row in rows:
            sheet.append(row)
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


@xlsx_extra
def test_cells_are_written_plainly_and_rows_keep_the_header_width():
    data = make_xlsx(
        {
            "Data": [
                [None, None],
                ["Name", "Score", None, None],
                ["Ada", 3.0, "extra", "cells"],
                ["Grace", 2.5],
                ["pipe|name", "line\nbreak"],
            ]
        }
    )
    assert page_texts(parse_bytes(data, filename="d.xlsx"))[0].splitlines() == [
        "## Data",
        "",
        "| Name | Score |",
        "|---|---|",
        "| Ada | 3 extra cells |",
        "| Grace | 2.5 |",
        "| pipe\\|name | line break |",
    ]


@xlsx_extra
def test_more_sheets_than_the_page_budget_are_refused(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGES": 2}
    data = make_xlsx({f"S{i}": [["a"], ["b"]] for i in range(3)})
    with pytest.raises(DocumentTooLarge, match="MAX_PDF_PAGES.*sheets") as caught:
        parse_bytes(data, filename="many.xlsx")
    assert caught.value.details["setting"] == "MAX_PDF_PAGES"


def test_a_csv_file_is_one_table_whatever_its_delimiter():
    for delimiter in ",;\t|":
        data = delimiter.join(["city", "rain (mm)"]) + "\r\n"
        data += delimiter.join(['"Bergen, NO"', "2250"]) + "\r\n"
        data += delimiter.join(["Lisbon", "690"]) + "\r\n"
        parsed = parse_bytes(data.encode(), filename="rain.csv")
        assert parsed.metadata == {"rows": 2, "delimiter": delimiter}
        assert parsed.text == (
            "| city | rain (mm) |\n|---|---|\n| Bergen, NO | 2250 |\n| Lisbon | 690 |"
        )


def test_csv_decoding_and_broken_quotes_are_typed_errors():
    from django_rag.exceptions import InvalidText

    with pytest.raises(InvalidText, match="not valid UTF-8"):
        parse_bytes("name\nCaf\xe9\n".encode("latin-1"), filename="l.csv")
    # A BOM-marked UTF-16 export (Excel's "Unicode text") is read.
    assert "| Café |" in parse_bytes("name\tx\nCafé\t1\n".encode("utf-16"), filename="u.tsv").text
    unclosed = b'a,b\n"never closed,' + b"x" * 200_000
    with pytest.raises(CorruptFile, match="not valid CSV at line") as caught:
        parse_bytes(unclosed, filename="broken.csv")
    assert caught.value.code == "corrupt_file"


def test_csv_rows_beyond_the_character_budget_are_refused_while_reading(settings):
    settings.DJANGO_RAG = {"MAX_DOCUMENT_CHARS": 10_000}
    data = b"a,b\n" + b"1,2\n" * 5_000  # 20 KB: fits the input bound, not the text budget
    with pytest.raises(DocumentTooLarge) as caught:
        parse_bytes(data, filename="long.csv")
    assert caught.value.details["setting"] == "MAX_DOCUMENT_CHARS"


# --- PPTX --------------------------------------------------------------------------------------


@pptx_extra
def test_a_slide_deck_is_one_page_per_slide_with_titles_lists_tables_and_notes():
    parsed = parse_file(FIXTURES / "quarterly_review.pptx")
    assert parsed.title == "Quarterly review"
    assert parsed.metadata == {"slide_count": 3, "author": "Strategy Office"}
    assert [page.number for page in parsed.pages] == [1, 2, 3]
    first, second, third = page_texts(parsed)
    assert first == "## Quarterly review\n\nSecond quarter, sales and service"
    assert second == (
        "## Highlights\n\n"
        "- Revenue grew eleven percent\n"
        "  - Mostly from the northern region\n"
        "- Churn fell to 2 percent\n\n"
        "Notes: Mention the new distributor in Oslo."
    )
    assert third == (
        "## Tickets by channel\n\n| Channel | Tickets |\n|---|---|\n| Email | 1,204 |\n| Phone | 388 |"
    )
    at = parsed.text.index("Oslo")
    assert parsed.page_range(parsed.text.index("Highlights"), at + 4) == (2, 2)
    assert parsed.page_range(0, len(parsed.text)) == (1, 3)


if find_spec("pptx") is not None:
    from django_rag.ingestion.parsers.pptx import PptxParser

    class PptxWithoutNotes(PptxParser):
        def __init__(self):
            super().__init__(include_notes=False)


@pptx_extra
def test_speaker_notes_can_be_left_out(settings):
    settings.DJANGO_RAG = {"PARSERS": {".pptx": "tests.test_formats.PptxWithoutNotes"}}
    parsed = parse_file(FIXTURES / "quarterly_review.pptx")
    assert "Oslo" not in parsed.text and "Churn fell" in parsed.text


@pptx_extra
def test_groups_are_read_in_reading_order_and_footers_dropped():
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])  # blank
    lower = slide.shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1))
    lower.text_frame.text = "Written last, shown at the bottom"
    group = slide.shapes.add_group_shape()
    inner = group.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    inner.text_frame.text = "Inside a group, shown at the top"
    buffer = io.BytesIO()
    deck.save(buffer)
    parsed = parse_bytes(buffer.getvalue(), filename="g.pptx")
    assert parsed.text == "Inside a group, shown at the top\n\nWritten last, shown at the bottom"
    assert parsed.title == ""


# --- EML ---------------------------------------------------------------------------------------


def make_email(body: str = "Body text.", *, subject: str = "Hello", html: str = "", **kwargs):
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"] = "a@example.org"
    message["To"] = "b@example.org"
    message["Subject"] = subject
    if body:
        message.set_content(body)
    if html:
        if body:
            message.add_alternative(html, subtype="html")
        else:
            message.set_content(html, subtype="html")
    for name, (data, maintype, subtype) in kwargs.get("attachments", {}).items():
        if maintype == "message":
            message.add_attachment(data)  # an EmailMessage: attached as message/rfc822
        else:
            message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message


@needs("pymupdf", "pdf")
def test_an_email_keeps_its_headers_body_and_its_pdf_attachment():
    parsed = parse_file(FIXTURES / "cooling_failure.eml")
    assert parsed.title == "Cooling failure in hall B"
    assert parsed.content_type == "message/rfc822" and parsed.format == "markdown"
    meta = parsed.metadata
    assert meta["from"] == ["Dana Reyes <dana.reyes@example.org>"]
    assert meta["to"] == ["Facilities <facilities@example.org>", "ops@example.org"]
    assert meta["cc"] == ["Site Lead <lead@example.org>"]
    assert meta["date"] == "2026-04-14T08:15:00+02:00"
    # The image goes through the registry too (read by OCR); this one is 40 bytes of
    # placeholder, so it is skipped: damaged where an OCR engine reads images, else of a type
    # the registry does not hold.
    from django_rag.ingestion.ocr import engine_name

    skipped = "corrupt_file" if engine_name() else "unsupported_file_type"
    assert meta["attachments"] == [
        {"filename": "incident-report.pdf", "content_type": "application/pdf", "size": 1361},
        {"filename": "photo.png", "content_type": "image/png", "size": 40, "skipped": skipped},
    ]
    text = parsed.text
    assert text.startswith(
        "# Cooling failure in hall B\n\nFrom: Dana Reyes <dana.reyes@example.org>\n"
    )
    assert "please schedule the compressor replacement this week." in text
    report = text.index("## Attachment: incident-report.pdf\n\nIncident report 2026-04")
    assert text.index("Temperature peaked at 41 degrees") > report
    assert "PNG" not in text


@html
def test_an_html_only_email_is_read_as_markdown_and_attached_emails_recursively(settings):
    inner = make_email("The inner message mentions the harbour crane.", subject="Inner")
    middle = make_email(
        "Middle body.", subject="Middle", attachments={"m": (inner, "message", "rfc822")}
    )
    outer = make_email(
        "",
        subject="Outer",
        html="<p>See the <b>forwarded</b> thread.</p><script>alert(1)</script>",
        attachments={"m": (middle, "message", "rfc822")},
    )
    parsed = parse_bytes(bytes(outer), filename="outer.eml")
    assert "See the **forwarded** thread." in parsed.text and "alert" not in parsed.text
    assert "## Attachment: attached.eml\n\n# Middle" in parsed.text
    assert "harbour crane" in parsed.text  # depth 2, within MAX_ATTACHMENT_DEPTH (3)
    settings.DJANGO_RAG = {"MAX_ATTACHMENT_DEPTH": 1}
    parsed = parse_bytes(bytes(outer), filename="outer.eml")
    assert "Middle body." in parsed.text and "harbour crane" not in parsed.text


def test_mail_in_a_wrong_charset_is_read_with_replacements():
    raw = (
        b"From: a@example.org\r\nSubject: =?utf-8?q?Caf=C3=A9?=\r\n"
        b'Content-Type: text/plain; charset="no-such-charset"\r\n\r\nCaf\xe9 au lait\r\n'
    )
    parsed = parse_bytes(raw, filename="odd.eml")
    assert parsed.title == "Café" and "Caf\ufffd au lait" in parsed.text


def test_a_file_without_headers_is_not_an_email():
    with pytest.raises(CorruptFile, match="not an email"):
        parse_bytes(b"\r\n\r\njust text", filename="x.eml")


@html
@pytest.mark.django_db(transaction=True)
def test_a_model_indexed_with_format_html_stores_its_rich_text_as_markdown(settings):
    from django_rag import sync
    from django_rag.models import Document
    from tests.syncapp.models import Note

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "BACKGROUND": "inline"}
    sync.unregister(Note)
    try:
        sync.indexed(text=["body"], collection="notes-html", format="html")(Note)
        note = Note.objects.create(body="<h2>Opening hours</h2><p>Open <em>daily</em>.</p>")
        document = Document.objects.get(source_id=f"syncapp.note:{note.pk}")
        assert document.content == "## Opening hours\n\nOpen *daily*."
        assert document.collection.name == "notes-html"
        version = document.version
        note.save()  # unchanged HTML: the stored Markdown is recognised, nothing re-indexed
        assert Document.objects.get(source_id=f"syncapp.note:{note.pk}").version == version
        note.body = "<p>Closed on Sundays.</p>"
        note.save()
        latest = Document.objects.filter(source_id=f"syncapp.note:{note.pk}").latest("version")
        assert latest.content == "Closed on Sundays."
    finally:
        sync.unregister(Note)
        sync.indexed(text=["body"], collection="notes", format="markdown")(Note)


@pytest.mark.parametrize(
    "filename, module, extra",
    [
        ("a.html", "trafilatura", "html"),
        ("a.docx", "docx", "docx"),
        ("a.pptx", "pptx", "pptx"),
        ("a.xlsx", "openpyxl", "xlsx"),
    ],
)
def test_a_format_whose_extra_is_missing_says_which_extra_to_install(
    monkeypatch, filename, module, extra
):
    from django_rag.exceptions import MissingDependency
    from django_rag.ingestion.parsers import common

    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed:
    monkeypatch.setattr(common, "installed_version", lambda distribution: None)  # no metadata
    with pytest.raises(MissingDependency, match=rf"django-rag\[{extra}\]") as caught:
        parse_bytes(b"PK\x05\x06" + b"\x00" * 18, filename=filename)
    assert caught.value.details["extra"] == extra
    # Found before the parser runs: the typed ParserUnavailable, naming the parser and file.
    assert caught.value.code == "parser_unavailable"
    assert caught.value.details["filename"] == filename


@docx_extra
def test_two_tables_in_a_row_stay_two_tables():
    from django_rag.ingestion.chunkers import markdown_tables

    def build(document):
        for header in ("First", "Second"):
            table = document.add_table(rows=2, cols=2)
            table.cell(0, 0).text, table.cell(0, 1).text = header, "b"
            table.cell(1, 0).text, table.cell(1, 1).text = "1", "2"

    text = parse_bytes(make_docx(build), filename="two.docx").text
    assert text == ("| First | b |\n|---|---|\n| 1 | 2 |\n\n| Second | b |\n|---|---|\n| 1 | 2 |")
    assert len(markdown_tables(text)) == 2

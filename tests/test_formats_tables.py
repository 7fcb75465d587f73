"""Tables stay tables: a PDF's ruled table and a Word table become Markdown tables, their cells
are found by full-text search, and the chunker keeps rows whole and gives every chunk that
starts inside a table the table's header (``metadata["table_header"]``)."""

from __future__ import annotations

import io
from importlib.util import find_spec

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import django_rag as rag
from django_rag.ingestion.chunkers import TokenChunker, markdown_tables
from django_rag.ingestion.parsers import parse_bytes

ROWS = [["City", "Rainfall (mm)", "Sunny days"]] + [
    [f"Town{i:02}", str(700 + 7 * i), str(120 + i)] for i in range(24)
]
ROWS[13] = ["Quillhaven", "2250", "61"]


def table_pdf(rows: list[list[str]], *, row_height: int = 22) -> bytes:
    """One page: a sentence, a ruled table (lines drawn around every cell), a sentence."""
    import pymupdf

    document = pymupdf.open()
    page = document.new_page(height=80 + row_height * len(rows) + 120)
    page.insert_text((50, 60), "Monthly rainfall by city, measured at the airports.", fontsize=11)
    top, left, width = 80, 50, 150
    bottom = top + row_height * len(rows)
    for r in range(len(rows) + 1):
        page.draw_line((left, top + r * row_height), (left + 3 * width, top + r * row_height))
    for c in range(4):
        page.draw_line((left + c * width, top), (left + c * width, bottom))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            page.insert_text((left + c * width + 4, top + r * row_height + 15), value, fontsize=10)
    page.insert_text((50, bottom + 40), "Figures from the national weather service.", fontsize=11)
    data = document.tobytes()
    document.close()
    return data


def table_docx(rows: list[list[str]]) -> bytes:
    import docx

    document = docx.Document()
    document.add_paragraph("Monthly rainfall by city, measured at the airports.")
    table = document.add_table(rows=0, cols=len(rows[0]))
    for row in rows:
        for cell, value in zip(table.add_row().cells, row, strict=True):
            cell.text = value
    document.add_paragraph("Figures from the national weather service.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


HEADER = "| City | Rainfall (mm) | Sunny days |\n|---|---|---|"


@pytest.mark.skipif(find_spec("pymupdf") is None, reason="the pdf extra is not installed")
def test_a_ruled_pdf_table_becomes_a_markdown_table_between_its_sentences():
    parsed = parse_bytes(table_pdf(ROWS[:4]), filename="rain.pdf")
    assert parsed.format == "markdown" and parsed.metadata["tables"] == 1
    assert parsed.text == (
        "Monthly rainfall by city, measured at the airports.\n\n"
        f"{HEADER}\n| Town00 | 700 | 120 |\n| Town01 | 707 | 121 |\n| Town02 | 714 | 122 |\n\n"
        "Figures from the national weather service."
    )


@pytest.mark.skipif(find_spec("pymupdf") is None, reason="the pdf extra is not installed")
def test_pdf_tables_can_be_turned_off(settings):
    settings.DJANGO_RAG = {"PDF_TABLES": False}
    parsed = parse_bytes(table_pdf(ROWS[:4]), filename="rain.pdf")
    assert parsed.format == "text" and "|" not in parsed.text and "tables" not in parsed.metadata
    assert "Town01 707 121" in parsed.text


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, build, module",
    [("rain.pdf", table_pdf, "pymupdf"), ("rain.docx", table_docx, "docx")],
)
def test_a_long_table_is_searched_by_its_cells_and_every_chunk_keeps_its_header(
    settings, name, build, module
):
    if find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    document = rag.ingest_bytes(
        build(ROWS), filename=name, collection="tables", chunk_size=40, chunk_overlap=8
    )
    assert HEADER in document.content
    chunks = list(document.chunks.order_by("chunk_index"))
    assert len(chunks) > 3
    rows = {line for line in document.content.splitlines() if line.startswith("| Town")}
    for chunk in chunks:
        lines = chunk.text.splitlines()
        # No row is cut: every table line of a chunk is a whole row of the document.
        for line in lines:
            if line.startswith("|") and line not in (HEADER.splitlines()):
                assert line in rows or line == "| Quillhaven | 2250 | 61 |", line
        starts_in_body = lines[0].startswith("| ") and not chunk.text.startswith(HEADER)
        assert (chunk.metadata.get("table_header") == HEADER) == starts_in_body
    hit = rag.search("Quillhaven", mode="fulltext", collection="tables")[0]
    assert "| Quillhaven | 2250 | 61 |" in hit.text
    stored = next(chunk for chunk in chunks if chunk.pk == hit.chunk_id)
    assert stored.metadata["table_header"] == HEADER


@pytest.mark.django_db
def test_the_dashboard_shows_a_chunks_table_header(staff, settings):
    from django.urls import reverse

    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    text = "Intro.\n\n" + HEADER + "\n" + "\n".join(f"| Town{i} | {i} | {i} |" for i in range(60))
    document = rag.ingest(text, collection="t", format="markdown", chunk_size=40, chunk_overlap=8)
    page = staff.get(reverse("django_rag_dashboard:document", args=[document.pk])).content.decode()
    assert 'class="chunk table-header"' in page
    assert "| City | Rainfall (mm) | Sunny days |" in page


# --- the chunker ------------------------------------------------------------------------------


def test_markdown_tables_are_found_with_their_header_and_body():
    text = "Intro\n\n| a | b |\n|---|:-:|\n| 1 | 2 |\n| 3 | 4 |\n\nAfter | not a table\n"
    (table,) = markdown_tables(text)
    assert text[table.start : table.body] == "| a | b |\n|---|:-:|\n"
    assert text[table.body : table.end] == "| 1 | 2 |\n| 3 | 4 |"
    assert markdown_tables("| a | b |\nno rule\n| 1 | 2 |") == []


cell = st.text(alphabet="abcdefgh xyz0123456789.", min_size=1, max_size=12).map(str.strip)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(cell.filter(bool), min_size=2, max_size=4),
    st.lists(st.lists(cell, min_size=1, max_size=4), min_size=1, max_size=40),
    st.integers(min_value=12, max_value=80),
    st.text(alphabet="abc .\n", max_size=200),
)
def test_chunks_never_cut_a_row_shorter_than_a_chunk_and_carry_the_header(
    header, rows, size, prose
):
    width = len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * width]
    for row in rows:
        row = (row + [""] * width)[:width]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    text = f"{prose.strip()}\n\n{table}\n\n{prose.strip()}".strip()
    chunker = TokenChunker(chunk_size=size, chunk_overlap=min(5, size - 1))
    (found,) = markdown_tables(text)
    header_text = text[found.start : found.body].rstrip("\n")
    for chunk in chunker.chunk(text, format="markdown"):
        assert text[chunk.start : chunk.end] == chunk.text
        in_body = found.body <= chunk.start < found.end
        assert (chunk.metadata.get("table_header") == header_text) == in_body
        for boundary in (chunk.start, chunk.end):
            if not found.start < boundary < found.end:
                continue
            line_start = text.rfind("\n", 0, boundary) + 1
            line_end = text.find("\n", boundary)
            line_end = len(text) if line_end < 0 else line_end
            if boundary in (line_start, line_end):
                continue  # between rows
            # Inside a row only where the row is longer than half a chunk: no row end was in
            # the part of the window where the chunker looks for one.
            assert _tokens(text[line_start:line_end]) > size // 2, (boundary, chunk.text)


def _tokens(text: str) -> int:
    from django_rag.ingestion.chunkers import _FALLBACK_TOKEN

    return len(_FALLBACK_TOKEN.findall(text))


# --- the PDF splice and its time budget ---------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    ),
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(1, 20), st.integers(1, 20)),
        max_size=3,
    ),
)
def test_the_pdf_splice_keeps_every_line_outside_tables_and_writes_each_table_once(layout, boxes):
    from django_rag.ingestion.parsers.pdftables import text_with_tables
    from django_rag.ingestion.pdftext import Block, Line

    blocks, words = [], []
    for b, lines in enumerate(layout):
        block_lines = []
        for n, (x, y) in enumerate(lines):
            word = f"w{b}x{n}"
            block_lines.append(Line(word, x * 10, y * 10, x * 10 + 8, y * 10 + 8))
            words.append(block_lines[-1])
        blocks.append(Block(block_lines))
    tables = [
        ((x * 10, y * 10, (x + w) * 10, (y + h) * 10), f"| T{i} | c |\n|---|---|\n| r{i} | v |")
        for i, (x, y, w, h) in enumerate(boxes)
    ]
    text = text_with_tables(blocks, tables).text
    for i in range(len(tables)):
        assert text.count(f"| T{i} | c |") == 1
    for line in words:
        inside = any(
            box[0] - 1 <= (line.x0 + line.x1) / 2 <= box[2] + 1
            and box[1] - 1 <= (line.y0 + line.y1) / 2 <= box[3] + 1
            for box, _ in tables
        )
        assert (line.text in text) != inside, line


@pytest.mark.skipif(find_spec("pymupdf") is None, reason="the pdf extra is not installed")
def test_the_table_finder_stops_after_half_the_parse_timeout(settings, monkeypatch):
    """Pages after the finder's share of PARSE_TIMEOUT are read as prose, and the metadata
    says from which page (the finder is slowed down here to stand for a heavy document)."""
    import time

    import pymupdf

    from django_rag.ingestion.parsers import pdf

    real = pdf.find_tables

    def slow(page):
        time.sleep(0.8)
        return real(page)

    monkeypatch.setattr(pdf, "find_tables", slow)
    settings.DJANGO_RAG = {"PARSE_TIMEOUT": 4}
    merged = pymupdf.open()
    for _ in range(4):
        merged.insert_pdf(pymupdf.open(stream=table_pdf(ROWS[:3]), filetype="pdf"))
    parsed = parse_bytes(merged.tobytes(), filename="four.pdf")
    assert parsed.metadata["tables_not_searched_from_page"] == 4
    assert parsed.metadata["tables"] == 3
    assert parsed.text.count("| City | Rainfall (mm) | Sunny days |") == 3
    assert parsed.text.count("Town01") == 4  # the last page's table is still read, as prose

"""Hostile office, web and mail files: compression bombs, XML entity expansion, deep nesting,
broken encodings and huge cells are refused with typed errors, within budget. The heavy ones
are parsed in a fresh process whose CPU time and peak memory are measured (the pattern of
tests/test_parsers_hostile.py)."""

from __future__ import annotations

import io
import zipfile
from importlib.util import find_spec

import pytest

from django_rag.exceptions import CorruptFile, DocumentTooLarge
from django_rag.ingestion.parsers import parse_bytes


def needs(module: str, extra: str):
    return pytest.mark.skipif(
        find_spec(module) is None, reason=f"the {extra} extra ({module}) is not installed"
    )


def zip_with(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def rewrite(data: bytes, replace: dict[str, bytes]) -> bytes:
    """``data`` (a ZIP) with some members' bytes replaced."""
    source = zipfile.ZipFile(io.BytesIO(data))
    members = {info.filename: source.read(info.filename) for info in source.infolist()}
    members.update(replace)
    return zip_with(members)


def docx_file(body_xml: bytes = b"", **replace: bytes) -> bytes:
    """A real DOCX (python-docx's template) whose body is ``body_xml`` (WordprocessingML)."""
    import docx

    buffer = io.BytesIO()
    docx.Document().save(buffer)
    data = buffer.getvalue()
    document = zipfile.ZipFile(io.BytesIO(data)).read("word/document.xml")
    if body_xml:
        start = document.index(b"<w:body>") + len(b"<w:body>")
        document = document[:start] + body_xml + document[start:]
    return rewrite(data, {"word/document.xml": document, **replace})


LAUGHS = (
    b'<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
    + b"".join(
        b'<!ENTITY lol%d "%s">' % (i, (b"&lol%d;" % (i - 1) if i > 1 else b"&lol;") * 10)
        for i in range(1, 10)
    )
    + b"]>\n"
)


def docx_laughs() -> bytes:
    """Billion laughs: a document.xml whose DTD expands one entity to 10^9 'lol's."""
    document = zipfile.ZipFile(io.BytesIO(docx_file())).read("word/document.xml")
    body = document.split(b"?>", 1)[1].replace(
        b"<w:body>", b"<w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p>"
    )
    return rewrite(docx_file(), {"word/document.xml": LAUGHS + body})


def docx_deep() -> bytes:
    """A paragraph nested 40,000 elements deep (smart tags inside smart tags; under 1 MiB,
    so no ZIP budget stops it first)."""
    depth = 40_000
    return docx_file(b"<w:p>" + b"<w:smartTag>" * depth + b"</w:smartTag>" * depth + b"</w:p>")


def docx_zip_bomb() -> bytes:
    """A DOCX whose document.xml inflates 1,000 times (to 50 MB)."""
    cell = b"<w:p><w:r><w:t>" + b"A" * 50_000_000 + b"</w:t></w:r></w:p>"
    return docx_file(cell)


def docx_huge_cell() -> bytes:
    """A table cell of 4 million distinct-ish characters (it compresses poorly)."""
    import random

    rng = random.Random(7)
    text = "".join(rng.choice("abcdefgh ") for _ in range(4_000_000)).encode()
    row = b"<w:tr><w:tc><w:p><w:r><w:t>" + text + b"</w:t></w:r></w:p></w:tc></w:tr>"
    return docx_file(b"<w:tbl>" + row + b"</w:tbl>")


def run_bounded(builder: str, extension: str, settings: dict | None = None) -> dict:
    """Parse ``builder()``'s file in a fresh process: its outcome, CPU time and peak memory."""
    # Imported here: the child process imports this module before Django's apps are ready.
    from tests.helpers import parse_in_bounded_child

    return parse_in_bounded_child("tests.test_formats_hostile", builder, extension, settings)


# builder, extension, settings, expected error code, expected setting (None: not a budget)
HOSTILE = [
    ("docx_laughs", ".docx", {}, "corrupt_file", None),
    ("docx_deep", ".docx", {}, "corrupt_file", None),
    ("docx_zip_bomb", ".docx", {}, "document_too_large", "MAX_ZIP_RATIO"),
    (
        "docx_huge_cell",
        ".docx",
        {"MAX_DOCUMENT_CHARS": 1_000_000},
        "document_too_large",
        "MAX_DOCUMENT_CHARS",
    ),
]
EXTRAS = {".docx": ("docx", "docx"), ".pptx": ("pptx", "pptx"), ".xlsx": ("openpyxl", "xlsx")}
EXTRAS |= {".html": ("trafilatura", "html"), ".eml": ("docx", "docx"), ".pdf": ("pymupdf", "pdf")}


@needs("docx", "docx")
def test_a_dtd_anywhere_in_an_office_file_is_refused_with_its_part_named():
    data = rewrite(docx_file(), {"docProps/core.xml": LAUGHS + b"<x>&lol9;</x>"})
    with pytest.raises(CorruptFile, match="docProps/core.xml.*declares a DTD") as caught:
        parse_bytes(data, filename="laughs.docx")
    assert caught.value.details["member"] == "docProps/core.xml"
    # In UTF-16 too.
    utf16 = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "b">]><x/>'
    data = rewrite(docx_file(), {"docProps/app.xml": utf16.encode("utf-16")})
    with pytest.raises(CorruptFile, match="declares a DTD"):
        parse_bytes(data, filename="laughs16.docx")


def xlsx_file(sheet_xml: bytes | None = None, **replace: bytes) -> bytes:
    """A real XLSX (openpyxl) whose first sheet's XML is ``sheet_xml``."""
    import openpyxl

    buffer = io.BytesIO()
    workbook = openpyxl.Workbook()
    workbook.active.append(["header", "value"])
    workbook.save(buffer)
    members = dict(replace)
    if sheet_xml is not None:
        members["xl/worksheets/sheet1.xml"] = sheet_xml
    return rewrite(buffer.getvalue(), members)


SHEET = (
    b'<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="http://schemas.openxmlformats.org/'
    b'spreadsheetml/2006/main"><sheetData>%s</sheetData></worksheet>'
)


def xlsx_sparse() -> bytes:
    """Two cells, A1 and XFD1048576: a sheet 16,384 columns by 1,048,576 rows once padded
    (17 billion cells), in a few hundred bytes; each row is as wide as its own cells."""
    rows = b'<row r="1"><c r="A1" t="inlineStr"><is><t>h</t></is></c></row>'
    rows += b'<row r="1048576"><c r="XFD1048576"><v>1</v></c></row>'
    return xlsx_file(SHEET % rows)


def xlsx_wide_rows() -> bytes:
    """300,000 rows each holding one cell in the last column (16,384 columns padded)."""
    rows = b"".join(
        b'<row r="%d"><c r="XFD%d"><v>1</v></c></row>' % (i, i) for i in range(1, 300_001)
    )
    return xlsx_file(SHEET % rows)


def xlsx_laughs() -> bytes:
    return xlsx_file(
        LAUGHS + SHEET % b'<row r="1"><c r="A1" t="inlineStr"><is><t>&lol9;</t></is></c></row>'
    )


def csv_unclosed_quote() -> bytes:
    """A quote opened and never closed: the rest of the file (400,000 short lines) is one
    field. (On a single line it would be a row over MAX_CSV_ROW_CHARS: tests/test_zip_budget.py.)"""
    return b'name,notes\nAda,"' + b"lorem ipsum\n" * 400_000


def pptx_file(slides: int = 1) -> bytes:
    import pptx

    deck = pptx.Presentation()
    for number in range(slides):
        deck.slides.add_slide(deck.slide_layouts[5]).shapes.title.text = f"Slide {number + 1}"
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def pptx_laughs() -> bytes:
    data = pptx_file()
    slide = zipfile.ZipFile(io.BytesIO(data)).read("ppt/slides/slide1.xml")
    slide = slide.split(b"?>", 1)[1].replace(b">Slide 1<", b">&lol9;<")
    return rewrite(data, {"ppt/slides/slide1.xml": LAUGHS + slide})


def eml_deep() -> bytes:
    """MIME parts nested 5,000 deep (the email package parses them recursively)."""
    depth = 5_000
    head = b"From: a@example.org\r\nSubject: deep\r\nMIME-Version: 1.0\r\n"
    body = b"".join(
        b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i)
        for i in range(depth)
    )
    body += b"Content-Type: text/plain\r\n\r\nhello\r\n"
    body += b"".join(b"--b%d--\r\n" % i for i in reversed(range(depth)))
    return head + body


def eml_carrying_a_bomb() -> bytes:
    """An email whose attachment is the DOCX compression bomb."""
    from email.message import EmailMessage

    message = EmailMessage()
    message["Subject"] = "Quarterly numbers"
    message.set_content("See attached.")
    message.add_attachment(
        docx_zip_bomb(), maintype="application", subtype="octet-stream", filename="numbers.docx"
    )
    return bytes(message)


def html_deep() -> bytes:
    """Text inside 200,000 nested elements (lxml stops building the tree at its depth limit)."""
    depth = 200_000
    return b"<html><body>" + b"<div>" * depth + b"deep text " * 50 + b"</div>" * depth


def html_entities() -> bytes:
    """An HTML page behind an XML declaration and a DTD of nested entities: nothing is
    expanded (lxml's HTML parser ignores the internal subset) and no main content is found."""
    return LAUGHS + b"<html><body><article><p>&lol9;</p>" + b"<p>Real words here.</p>" * 40


def html_attributes() -> bytes:
    """One element with 100,000 attributes: libxml2 compares each with the ones before it (20 s
    a parse, 307 s in trafilatura's passes); the tag is cut to 100 before lxml reads it."""
    names = b" ".join(b"a%d" % i for i in range(100_000))
    return b"<html><body><div " + names + b"><p>Refunds take fourteen days.</p></div></body></html>"


def html_unclosed() -> bytes:
    """500,000 unclosed <a> (33 s and 1.3 GB in trafilatura): refused past 200,000 elements."""
    return b"<html><body>" + b"<a>" * 500_000 + b"<p>Refunds take fourteen days.</p></body></html>"


def pdf_drawing_bomb() -> bytes:
    """A page with a line of text and 4 MB of line segments (200,000 paths): under the page's
    content budget, but the table finder would spend 8 s and 560 MB on it."""
    from tests.test_parsers_hostile import SHOW_TEXT, one_page_pdf, stream_object

    ops = b"".join(
        b"%d %d m %d %d l S\n" % (i % 500, i % 700, i % 500 + 1, i % 700 + 1)
        for i in range(200_000)
    )
    return one_page_pdf(stream_object(SHOW_TEXT + ops), resources=b"/Font << /F1 5 0 R >>")


HOSTILE += [
    ("xlsx_laughs", ".xlsx", {}, "corrupt_file", None),
    # Whichever budget a machine reaches first refuses it: the 2 s or the characters.
    (
        "xlsx_wide_rows",
        ".xlsx",
        {"PARSE_TIMEOUT": 2},
        "document_too_large",
        ("PARSE_TIMEOUT", "MAX_DOCUMENT_CHARS"),
    ),
    ("csv_unclosed_quote", ".csv", {}, "corrupt_file", None),
    ("pptx_laughs", ".pptx", {}, "corrupt_file", None),
    ("eml_deep", ".eml", {}, "corrupt_file", None),
    ("pdf_drawing_bomb", ".pdf", {}, "parsed", None),
    ("html_deep", ".html", {}, "empty_document", None),
    ("html_entities", ".html", {}, "empty_document", None),
    ("html_attributes", ".html", {}, "parsed", None),
    ("html_unclosed", ".html", {}, "document_too_large", None),
    ("eml_carrying_a_bomb", ".eml", {}, "document_too_large", "MAX_ZIP_RATIO"),
]


def png_chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    """A PNG of a few kilobytes whose header declares ``width`` x ``height`` grey pixels."""
    import struct
    import zlib

    rows = zlib.compress(b"\x00" + b"\xff" * min(width, 4096), 9) * 4  # a few rows, not all
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + png_chunk(b"IDAT", rows)
        + png_chunk(b"IEND", b"")
    )


def png_gigapixel_bomb() -> bytes:
    return png_declaring(100_000, 100_000)  # 10 GP: past Pillow's own cap


def png_100mp_bomb() -> bytes:
    return png_declaring(10_000, 10_000)  # under Pillow's error cap, over django_rag's


def jpeg_declaring_65k_square() -> bytes:
    """A small JPEG whose frame header is rewritten to 65,000 x 65,000 (4 GP, refused from the
    header before any pixel is decoded)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (16, 16), 255).save(out, "JPEG")
    data = bytearray(out.getvalue())
    at = data.index(b"\xff\xc0") + 5
    data[at : at + 4] = (65_000).to_bytes(2, "big") * 2
    return bytes(data)


def png_truncated() -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (800, 600), "white")
    ImageDraw.Draw(image).text((10, 10), "cut short " * 20, fill="black")
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=0)
    data = out.getvalue()
    return data[: len(data) // 2]


HOSTILE += [
    ("png_gigapixel_bomb", ".png", {}, "document_too_large", None),
    ("png_100mp_bomb", ".png", {}, "document_too_large", None),
    ("jpeg_declaring_65k_square", ".jpg", {}, "document_too_large", None),
    ("png_truncated", ".png", {}, "corrupt_file", None),
]
EXTRAS |= {ext: ("rapidocr_onnxruntime", "ocr") for ext in (".png", ".jpg")}


@needs("pptx", "pptx")
def test_more_slides_than_the_page_budget_are_refused(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGES": 3}
    assert len(parse_bytes(pptx_file(3), filename="ok.pptx").pages) == 3
    with pytest.raises(DocumentTooLarge, match="MAX_PDF_PAGES.*slides"):
        parse_bytes(pptx_file(4), filename="long.pptx")


@needs("openpyxl", "xlsx")
def test_a_sparse_sheet_is_read_as_its_cells_not_its_declared_size():
    parsed = parse_bytes(xlsx_sparse(), filename="sparse.xlsx")
    lines = parsed.text.splitlines()
    assert lines[:4] == ["## Sheet", "", "| h |", "|---|"]
    # The far cell joins the header's single column instead of widening the table.
    assert lines[4].startswith("| ") and lines[4].endswith(" 1 |") and len(lines) == 5


@pytest.mark.parametrize(
    "builder, extension, settings, code, setting", HOSTILE, ids=[c[0] for c in HOSTILE]
)
def test_hostile_files_are_refused_in_bounded_time_and_memory(
    builder, extension, settings, code, setting
):
    module, extra = EXTRAS.get(extension, (None, None))
    if module and find_spec(module) is None:
        pytest.skip(f"the {extra} extra ({module}) is not installed")
    result = run_bounded(builder, extension, settings)
    allowed = setting if isinstance(setting, tuple) else (setting,)
    assert result["outcome"] == code and result["setting"] in allowed, result
    assert result["cpu_seconds"] < 10, result
    assert result["peak_mb"] < 400, result


@needs("docx", "docx")
def test_a_word_part_that_is_not_utf8_is_corrupt():
    document = zipfile.ZipFile(io.BytesIO(docx_file())).read("word/document.xml")
    broken = document.replace(b"<w:body>", b"<w:body><w:p><w:r><w:t>caf\xe9</w:t></w:r></w:p>")
    with pytest.raises(CorruptFile, match="could not be read as a Word document"):
        parse_bytes(rewrite(docx_file(), {"word/document.xml": broken}), filename="latin.docx")


@needs("pptx", "pptx")
def test_groups_nested_past_the_limit_are_skipped_not_recursed():
    """A slide whose text sits inside 200 nested groups: python-pptx's XML parser takes 200
    levels, the parser reads groups 16 deep and skips the rest (no recursion without end)."""
    import pptx

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    group = slide.shapes.add_group_shape()
    group.shapes.add_textbox(0, 0, 100, 100).text_frame.text = "deep inside"
    slide.shapes.add_textbox(0, 200, 100, 100).text_frame.text = "on the slide"
    buffer = io.BytesIO()
    deck.save(buffer)
    data = buffer.getvalue()
    xml = zipfile.ZipFile(io.BytesIO(data)).read("ppt/slides/slide1.xml")
    start, end = xml.index(b"<p:grpSp>"), xml.index(b"</p:grpSp>") + len(b"</p:grpSp>")
    group_xml = xml[start:end]
    head = group_xml[: group_xml.index(b"<p:sp>")]
    nested = head * 200 + group_xml[len(head) :] + b"</p:grpSp>" * 199
    data = rewrite(data, {"ppt/slides/slide1.xml": xml[:start] + nested + xml[end:]})
    parsed = parse_bytes(data, filename="nested.pptx")
    assert parsed.text == "on the slide"

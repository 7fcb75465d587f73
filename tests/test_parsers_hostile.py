"""Hostile inputs: parsers and rag_ingest must refuse them early, with typed errors.

Budgets here are generous upper bounds (a test fails only when something is orders of
magnitude off, as a backtracking regex or an unbounded decompression is), not benchmarks.
"""

import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import zlib
from io import StringIO
from pathlib import Path

import pymupdf
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rag.exceptions import CorruptFile, DocumentTooLarge, FileNotFound, InvalidText
from django_rag.ingestion.archives import open_zip, read_member
from django_rag.ingestion.parsers import (
    ParsedDocument,
    Parser,
    longest_cmap_string,
    markdown_title,
    parse_bytes,
    parse_file,
)

ROOT = Path(__file__).resolve().parent.parent


# --- hand-written PDFs ---------------------------------------------------------------------


def stream_object(data: bytes, extra: bytes = b"", *, compress: bool = True) -> bytes:
    if compress:
        data = zlib.compress(data, 9)
        extra += b" /Filter /FlateDecode"
    return b"<< /Length %d%s >>\nstream\n" % (len(data), extra) + data + b"\nendstream"


def write_pdf(objects: list[bytes]) -> bytes:
    """A PDF whose object n (1-based) is ``objects[n - 1]``; 1 must be the catalog."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def one_page_pdf(content: bytes, *, resources: bytes = b"", extra_objects=(), page_extra=b""):
    """Objects: 1 catalog, 2 pages, 3 page, 4 content stream, 5 Helvetica, 6... extra_objects."""
    return write_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> " + resources + b" >> " + page_extra + b">>",
            content,
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            *extra_objects,
        ]
    )


SHOW_TEXT = b"BT /F1 12 Tf 72 720 Td (" + b"A" * 200 + b") Tj ET\n"


def bomb_pdf(inflated_bytes: int = 200_000_000) -> bytes:
    """One page whose content stream inflates to ``inflated_bytes`` of text operators.

    Built in milliseconds without compressing it all: a 1 MB block of operators is deflated
    once and ended with a full flush (so it does not refer back), and that piece is repeated;
    the zlib trailer carries the real checksum of the whole.
    """
    block = SHOW_TEXT * (1_000_000 // len(SHOW_TEXT))
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = raw.compress(block) + raw.flush(zlib.Z_FULL_FLUSH)
    copies = inflated_bytes // len(block)
    checksum = 1
    for _ in range(copies):
        checksum = zlib.adler32(block, checksum)
    end = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = b"\x78\xda" + piece * copies + end.flush() + checksum.to_bytes(4, "big")
    return one_page_pdf(stream_object(deflated, b" /Filter /FlateDecode", compress=False))


def pdf_pages(count: int, text: str) -> bytes:
    document = pymupdf.open()
    for number in range(count):
        document.new_page().insert_text((72, 72), f"{text} {number + 1}", fontsize=11)
    data = document.tobytes()
    document.close()
    return data


# --- H1: Markdown title in linear time ------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "# a" + " " * 50_000 + "x",
        "# a" + " " * 50_000 + "#" * 50_000 + " " * 50_000 + "x",
        "#" * 200_000,
        "# " + "#" * 200_000 + " x",
        "# a" + " #" * 100_000 + "x",
        "# a" + " " * 1_000_000 + "x",
        " " * 1_000_000,
        (" " * 3 + "#" + " " * 1000 + "\n") * 1000,
        ("#x\n" * 300_000) + "# found",
    ],
    ids=[
        "spaces",
        "spaces-hashes-spaces",
        "hashes",
        "heading-of-hashes",
        "space-hash",
        "heading-1MB-spaces",
        "1MB-spaces",
        "empty-headings",
        "many-lines",
    ],
)
def test_markdown_title_is_linear_on_pathological_input(text):
    started = time.perf_counter()
    parse_bytes(text.encode(), filename="evil.md")
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize(
    "text, title",
    [
        ("Intro\n\n# The Title\n\nbody", "The Title"),
        ("   # Indented ok  \n", "Indented ok"),
        ("    # four spaces is code\n# Real", "Real"),
        ("# Closed ##   \n", "Closed"),
        ("# C#\n", "C#"),  # a closing run needs a space before it (CommonMark)
        ("# #\n#\n# Second\n", "Second"),  # empty headings are skipped
        ("## Sub\n#tag\n# Top\r\n", "Top"),
        ("#\tTabbed\n", "Tabbed"),
        ("no heading at all", ""),
        ("# " + "x" * 600, "x" * 500),
    ],
)
def test_markdown_title_keeps_its_rules(text, title):
    assert markdown_title(text) == title
    assert parse_bytes(text.encode(), filename="t.md").title == title


# --- H2: PDF budgets, enforced while extracting ---------------------------------------------

CHILD = """
import json, sys, time
from django.conf import settings
settings.configure(DJANGO_RAG={})
from tests.test_parsers_hostile import bomb_pdf
from django_rag.ingestion.parsers import parse_bytes
data = bomb_pdf()
started = time.perf_counter()
try:
    parse_bytes(data, filename="bomb.pdf")
    outcome = "parsed"
except Exception as exc:
    outcome = getattr(exc, "code", type(exc).__name__)
print(json.dumps({
    "outcome": outcome,
    "seconds": time.perf_counter() - started,
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large pytest
    # process would report its parent's peak.
    "peak_mb": next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")
    ) / 1024,
    "size": len(data),
}))
"""


def test_pdf_bomb_is_refused_fast_with_bounded_memory():
    """583 KB of PDF inflating to 200 MB of text operators: 6 GB and 167 s before the fix."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["size"] < 1_000_000
    assert result["outcome"] == "document_too_large"
    assert result["seconds"] < 5
    assert result["peak_mb"] < 500


def test_page_content_budget_names_the_page_and_setting(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 1_000_000}
    with pytest.raises(DocumentTooLarge, match="page 1 .*MAX_PDF_PAGE_CONTENT_BYTES") as info:
        parse_bytes(bomb_pdf(3_000_000), filename="big.pdf")
    assert info.value.code == "document_too_large"
    assert info.value.details["setting"] == "MAX_PDF_PAGE_CONTENT_BYTES"
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": None}
    assert "AAAA" in parse_bytes(bomb_pdf(1_000_000), filename="ok.pdf").text


def form_pdf(calls: int) -> bytes:
    """A small page that draws one text form ``calls`` times."""
    form = stream_object(
        SHOW_TEXT,
        b" /Type /XObject /Subtype /Form /BBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >>",
    )
    return one_page_pdf(
        stream_object(b"q /Fm#30 Do Q\n" + b"/Fm0 Do\n" * (calls - 1)),
        resources=b"/XObject << /Fm0 6 0 R >>",
        extra_objects=[form],
    )


def test_a_form_drawn_many_times_counts_per_call(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 1_000_000}
    # 20,000 calls of a 230-byte form: a 30 KB stream (compressed) that draws 4.6 MB.
    with pytest.raises(DocumentTooLarge, match="page 1"):
        parse_bytes(form_pdf(20_000), filename="forms.pdf")
    assert "AAAA" in parse_bytes(form_pdf(3), filename="forms.pdf").text


def test_real_forms_and_annotations_stay_within_budget(settings):
    """A page embedding another page (a form) and carrying an annotation parses normally."""
    source = pymupdf.open(stream=pdf_pages(1, "embedded words"), filetype="pdf")
    document = pymupdf.open()
    page = document.new_page()
    page.show_pdf_page(page.rect, source, 0)
    page.add_freetext_annot(pymupdf.Rect(72, 400, 300, 450), "annotation words")
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 100_000}
    parsed = parse_bytes(document.tobytes(), filename="forms.pdf")
    assert "embedded words" in parsed.text


def test_annotation_appearance_streams_count(settings):
    appearance = stream_object(
        SHOW_TEXT * 2000,
        b" /Type /XObject /Subtype /Form /BBox [0 0 100 100] "
        b"/Resources << /Font << /F1 5 0 R >> >>",
    )
    annotation = b"<< /Type /Annot /Subtype /FreeText /Rect [0 0 100 100] /AP << /N 7 0 R >> >>"
    data = one_page_pdf(
        stream_object(b"BT /F1 12 Tf 72 720 Td (page text) Tj ET"),
        extra_objects=[annotation, appearance],
        page_extra=b"/Annots [6 0 R] ",
    )
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 100_000}
    with pytest.raises(DocumentTooLarge, match="page 1"):
        parse_bytes(data, filename="annot.pdf")
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 1_000_000}
    assert "page text" in parse_bytes(data, filename="annot.pdf").text


def test_page_budget_is_checked_before_reading(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGES": 2}
    with pytest.raises(DocumentTooLarge, match=r"3 pages, more than MAX_PDF_PAGES \(2\)"):
        parse_bytes(pdf_pages(3, "page"), filename="long.pdf")
    settings.DJANGO_RAG = {"MAX_PDF_PAGES": 3}
    assert len(parse_bytes(pdf_pages(3, "page"), filename="long.pdf").pages) == 3


def test_character_budget_stops_at_the_page_that_crosses_it(settings):
    settings.DJANGO_RAG = {"MAX_DOCUMENT_CHARS": 30}
    with pytest.raises(DocumentTooLarge, match="MAX_DOCUMENT_CHARS") as info:
        parse_bytes(pdf_pages(50, "twenty characters ."), filename="chars.pdf")
    assert info.value.details["page"] == 2


def test_time_budget_is_checked_between_pages(settings):
    settings.DJANGO_RAG = {"PARSE_TIMEOUT": 1e-9}
    with pytest.raises(DocumentTooLarge, match="PARSE_TIMEOUT") as info:
        parse_bytes(pdf_pages(3, "slow"), filename="slow.pdf")
    assert info.value.details["setting"] == "PARSE_TIMEOUT"


@pytest.mark.parametrize("name", ["MAX_PDF_PAGES", "MAX_PDF_PAGE_CONTENT_BYTES", "PARSE_TIMEOUT"])
@pytest.mark.parametrize("value", [0, -1, "many", True])
def test_budget_settings_are_validated(settings, name, value):
    settings.DJANGO_RAG = {name: value}
    with pytest.raises(ImproperlyConfigured, match=name):
        parse_bytes(pdf_pages(1, "x"), filename="x.pdf")


# --- what extraction produces: characters, not only bytes -----------------------------------


def to_unicode_cmap(code: bytes, characters: int) -> bytes:
    """A ToUnicode CMap mapping the one-byte ``code`` to ``characters`` characters."""
    destination = "".join("%04X" % (0x41 + i % 26) for i in range(characters)).encode()
    return (
        b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Bomb def "
        b"1 begincodespacerange <00> <FF> endcodespacerange "
        b"1 beginbfchar <" + code.hex().encode() + b"> <" + destination + b"> endbfchar "
        b"endcmap CMapName currentdict /CMap defineresource pop end end"
    )


def cmap_bomb_pdf(codes: int = 4_000_000, characters: int = 128) -> bytes:
    """One page showing the code 0x01 ``codes`` times in a font whose ToUnicode CMap maps it
    to ``characters`` characters: 4 MB of codes (a 5 KB file) make 512 million characters."""
    show = b"BT /F1 12 Tf 72 720 Td (" + b"\x01" * codes + b") Tj ET\n"
    return write_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            stream_object(show),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /ToUnicode 6 0 R >>",
            stream_object(to_unicode_cmap(b"\x01", characters)),
        ]
    )


def run_bounded(builder: str, extension: str) -> dict:
    """Parse ``builder()``'s file in a fresh process; its outcome, CPU time and peak memory."""
    # Imported here: the child process imports this module before Django's apps are ready.
    from tests.helpers import parse_in_bounded_child

    return parse_in_bounded_child(
        "tests.test_parsers_hostile",
        builder,
        extension,
        {"PARSERS": {".docx": "tests.test_parsers_hostile.DocxTextParser"}},
    )


# The hostile-file table: each file is parsed in a fresh process (address space fenced at
# 4 GiB), and must be refused with a typed error naming its budget, in bounded CPU and memory.
# Before each fix: 4.4 GB (content), 11.8 GB (CMap, as reported), unbounded (the others).
HOSTILE_FILES = [
    # builder, extension, budget, largest file size
    ("bomb_pdf", ".pdf", "MAX_PDF_PAGE_CONTENT_BYTES", 1_000_000),
    ("cmap_bomb_pdf", ".pdf", "MAX_PDF_PAGE_CONTENT_BYTES", 10_000),
    ("actualtext_bomb_pdf", ".pdf", "MAX_PDF_PAGE_CONTENT_BYTES", 100_000),
    ("pattern_bomb_pdf", ".pdf", "MAX_PDF_PAGE_CONTENT_BYTES", 100_000),
    ("softmask_bomb_pdf", ".pdf", "MAX_PDF_PAGE_CONTENT_BYTES", 100_000),
    ("docx_bomb", ".docx", "MAX_ZIP_RATIO", 300_000),
]


@pytest.mark.parametrize(
    "builder, extension, setting, size", HOSTILE_FILES, ids=[c[0] for c in HOSTILE_FILES]
)
def test_hostile_files_are_refused_with_bounded_memory(builder, extension, setting, size):
    """The CMap bomb: a 5 KB PDF whose font maps one code to 128 characters, shown 4 million
    times; its 4 MB of instructions were under MAX_PDF_PAGE_CONTENT_BYTES, and extracting its
    512 million characters took 11.8 GB before each byte was counted for its characters."""
    result = run_bounded(builder, extension)
    assert result["size"] < size
    assert (result["outcome"], result["setting"]) == ("document_too_large", setting)
    assert result["cpu_seconds"] < 5
    assert result["peak_mb"] < 300


def test_amplification_is_counted_per_byte_and_named_in_the_error(settings):
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 1_000_000}
    with pytest.raises(DocumentTooLarge, match="128 characters one code") as info:
        parse_bytes(cmap_bomb_pdf(codes=10_000), filename="amplified.pdf")  # 1.28 M chars
    assert info.value.details["characters_per_code"] == 128
    assert info.value.details["setting"] == "MAX_PDF_PAGE_CONTENT_BYTES"
    # The same page under the budget is read, each code giving its 128 characters (those
    # drawn inside the page's box: the line runs off it).
    text = parse_bytes(cmap_bomb_pdf(codes=5_000), filename="amplified.pdf").text
    assert text.startswith("ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 4)
    # An ordinary ToUnicode (one character a code) costs its bytes only.
    text = parse_bytes(cmap_bomb_pdf(codes=900_000, characters=1), filename="plain.pdf").text
    assert text.startswith("AAAA")


@pytest.mark.parametrize(
    "cmap, longest",
    [
        (b"<01> <0041004200430044>", 8),
        (b"<01> <00 41 00 42>", 4),
        (b"<01> (\x00A\x00B\x00C)", 6),
        (b"<01> (a(b)c)", 5),  # nested parentheses belong to the string
        (b"<01> (a\\)b)", 4),  # an escaped parenthesis too
        (b"<01> (endbfchar inside)", 16),  # a keyword inside a string is the string's
        (b"<00> <FF> [<0041> <00410042004300440045>]", 10),  # a bfrange's array
    ],
)
def test_longest_cmap_string(cmap, longest):
    """Only strings inside the mappings count: CIDSystemInfo's "(Adobe)" is no destination."""
    header = b"/CIDSystemInfo << /Registry (Adobe-Identity-UCS-long-name) >> begincmap "
    mappings = b"1 beginbfchar " + cmap + b" endbfchar endcmap (also-not-a-destination-string)"
    assert longest_cmap_string(header + mappings) == longest
    assert longest_cmap_string(b"beginbfchar <01> (unterminated") == 12


@pytest.mark.parametrize(
    "cmap", [b"(" * 2_000_000, b"<" * 2_000_000, b"\\" * 2_000_000, b"<0" * 1_000_000]
)
def test_longest_cmap_string_is_linear(cmap):
    started = time.process_time()
    longest_cmap_string(cmap)
    assert time.process_time() - started < 5


def named_calls_pdf(calls: int, kind: str, length: int = 10_000) -> bytes:
    """A page calling one named resource ``calls`` times: a marked-content property list
    whose ActualText has ``length`` characters, a tiling pattern or a soft mask showing text."""
    text = b"BT /F1 12 Tf 72 720 Td (" + b"A" * length + b") Tj ET"
    form = (
        b" /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >>"
    )
    if kind == "actualtext":
        call, resources = (
            b"/Span /P0 BDC BT /F1 12 Tf 72 700 Td (x) Tj ET EMC\n",
            b"/Properties << /P0 6 0 R >>",
        )
        target = b"<< /ActualText (" + b"Z" * length + b") >>"
    elif kind == "pattern":
        call, resources = b"/Pattern cs /P0 scn 0 0 612 792 re f\n", b"/Pattern << /P0 6 0 R >>"
        target = stream_object(
            text,
            b" /Type /Pattern /PatternType 1 /PaintType 1 /TilingType 1 /BBox [0 0 612 792] "
            b"/XStep 612 /YStep 792 /Resources << /Font << /F1 5 0 R >> >>",
        )
    else:  # a graphics state whose soft mask is a form showing text
        call = b"q /GS0 gs 0 0 612 792 re f Q\n"
        resources = b"/ExtGState << /GS0 << /SMask << /S /Luminosity /G 6 0 R >> >> >>"
        target = stream_object(text, form + b" /Group << /S /Transparency /CS /DeviceGray >>")
    return one_page_pdf(
        stream_object(b"BT /F1 12 Tf 72 600 Td (page text) Tj ET\n" + call * calls),
        resources=resources,
        extra_objects=[target],
    )


def actualtext_bomb_pdf() -> bytes:
    return named_calls_pdf(20_000, "actualtext")  # 200 million characters


def pattern_bomb_pdf() -> bytes:
    return named_calls_pdf(20_000, "pattern")


def softmask_bomb_pdf() -> bytes:
    return named_calls_pdf(20_000, "softmask")


@pytest.mark.parametrize("kind", ["actualtext", "pattern", "softmask"])
def test_named_resources_count_once_per_call(settings, kind):
    """What a named resource yields counts for every call: 500 calls of 10,000 characters are
    5 million characters from a stream of 20 KB."""
    settings.DJANGO_RAG = {"MAX_PDF_PAGE_CONTENT_BYTES": 1_000_000}
    with pytest.raises(DocumentTooLarge, match="page 1"):
        parse_bytes(named_calls_pdf(500, kind), filename=f"{kind}.pdf")
    assert "page text" in parse_bytes(named_calls_pdf(2, kind), filename=f"{kind}.pdf").text


# --- ZIP-based inputs (DOCX, XLSX...) ----------------------------------------------------------


class DocxTextParser(Parser):
    """The text of a DOCX's ``word/document.xml``, read the way a real DOCX parser must:
    through :func:`open_zip` (no built-in parser reads ZIPs yet)."""

    content_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        with open_zip(data, filename=filename) as archive:
            xml = read_member(archive, "word/document.xml", filename=filename)
        text = " ".join(re.sub(rb"<[^>]{0,1000}>", b" ", xml).decode("utf-8").split())
        return ParsedDocument(text=text, content_type=self.content_type)


def deflated(block: bytes, copies: int) -> tuple[bytes, int, int]:
    """Raw deflate data of ``block`` repeated ``copies`` times, its CRC-32 and size, made
    without compressing it all (one compressed piece, ended by a full flush, repeated)."""
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = raw.compress(block) + raw.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(copies):
        crc = zlib.crc32(block, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    return piece * copies + end, crc, len(block) * copies


def zip_archive(members: list[tuple[str, bytes, int, int]], *, declared: dict | None = None):
    """A ZIP of ``(name, raw deflate data, crc, size)`` members; ``declared`` overrides the
    uncompressed size the central directory states for a member (a lying archive)."""
    out, directory = bytearray(), bytearray()
    for name, data, crc, size in members:
        stated = (declared or {}).get(name, size)
        header = struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(data), stated, len(name), 0
        )
        directory += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50, 20, 20, 0, 8, 0, 0x21, crc, len(data), stated, len(name), 0, 0, 0, 0, 0,
            len(out),
        )  # fmt: skip
        directory += name.encode()
        out += header + name.encode() + data
    end = struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory), len(out), 0
    )
    return bytes(out + directory + end)


CONTENT_TYPES = b'<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'


def docx(body: bytes, copies: int = 1, *, declared: dict | None = None) -> bytes:
    """A DOCX-shaped ZIP whose ``word/document.xml`` is ``body`` repeated ``copies`` times."""
    return zip_archive(
        [
            ("[Content_Types].xml", *deflated(CONTENT_TYPES, 1)),
            ("word/document.xml", *deflated(body, copies)),
        ],
        declared=declared,
    )


def docx_bomb() -> bytes:
    """A 200 KB DOCX whose document.xml inflates to 200 MB (1,000 times its compressed size)."""
    return docx(b"<w:p><w:r><w:t>" + b"A" * 1_000_000 + b"</w:t></w:r></w:p>", 200)


DOCX = {"PARSERS": {".docx": "tests.test_parsers_hostile.DocxTextParser"}}


def test_zip_budgets_name_their_setting(settings):
    settings.DJANGO_RAG = DOCX
    with pytest.raises(DocumentTooLarge, match=r"inflates \d+ times.*MAX_ZIP_RATIO") as info:
        parse_bytes(docx_bomb(), filename="bomb.docx")
    assert info.value.details["member"] == "word/document.xml"
    body = b"<w:p><w:t>Refunds take 14 days.</w:t></w:p>"
    assert parse_bytes(docx(body), filename="ok.docx").text == "Refunds take 14 days."
    settings.DJANGO_RAG = {**DOCX, "MAX_ZIP_UNCOMPRESSED_BYTES": 1_000}
    with pytest.raises(DocumentTooLarge, match="MAX_ZIP_UNCOMPRESSED_BYTES"):
        parse_bytes(docx(body, 40), filename="big.docx")
    settings.DJANGO_RAG = {**DOCX, "MAX_ZIP_MEMBERS": 1}
    with pytest.raises(DocumentTooLarge, match="2 members.*MAX_ZIP_MEMBERS"):
        parse_bytes(docx(body), filename="many.docx")
    # Each budget holds alone: without the ratio, the total stops the bomb.
    settings.DJANGO_RAG = {**DOCX, "MAX_ZIP_RATIO": None, "MAX_ZIP_UNCOMPRESSED_BYTES": 10**8}
    with pytest.raises(DocumentTooLarge, match="200,006,[0-9]+ bytes"):
        parse_bytes(docx_bomb(), filename="bomb.docx")


def test_a_zip_directory_too_large_for_its_members_is_refused_before_reading(settings):
    settings.DJANGO_RAG = {**DOCX, "MAX_ZIP_MEMBERS": 10}
    members = [(f"word/part{i:05}.xml", *deflated(b"x", 1)) for i in range(2_000)]
    with pytest.raises(DocumentTooLarge, match="central directory"):
        parse_bytes(zip_archive(members), filename="parts.docx")


def test_a_member_inflating_past_its_declared_size_is_refused(settings):
    """The directory may lie: the member is stopped one byte past its declared size
    (tests/test_zip_budget.py has the property-based and memory tests)."""
    settings.DJANGO_RAG = DOCX
    data = docx(b"<w:t>" + b"A" * 100_000 + b"</w:t>", 100, declared={"word/document.xml": 10})
    started = time.process_time()
    with pytest.raises(DocumentTooLarge, match="inflates past the 10 bytes") as info:
        parse_bytes(data, filename="liar.docx")
    assert info.value.details == {
        "filename": "liar.docx",
        "member": "word/document.xml",
        "declared": 10,
    }
    assert time.process_time() - started < 5


@pytest.mark.parametrize("data", [b"", b"PK\x05\x06", b"not a zip" * 100, b"PK\x03\x04" * 10])
def test_a_damaged_zip_is_a_typed_error(settings, data):
    settings.DJANGO_RAG = DOCX
    with pytest.raises(CorruptFile):
        parse_bytes(data, filename="broken.docx")


# --- text budgets ---------------------------------------------------------------------------


def test_oversized_text_is_refused_before_decoding(settings, tmp_path):
    settings.DJANGO_RAG = {"MAX_DOCUMENT_CHARS": 10}
    with pytest.raises(DocumentTooLarge, match="refused unread"):
        parse_bytes(b"\xe9" * 45, filename="big.txt")  # not even UTF-8: never decoded
    assert parse_bytes(b"\xf0\x9f\x98\x80" * 10, filename="ok.md").text == "\U0001f600" * 10
    path = tmp_path / "sparse.txt"
    with path.open("wb") as file:
        file.truncate(1 << 30)  # 1 GiB, not allocated: refused from its size, never read
    settings.DJANGO_RAG = {}
    with pytest.raises(DocumentTooLarge, match="1,073,741,824 bytes"):
        parse_file(path)


# --- M6: broken UTF-16 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, position",
    [
        (b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8" + "x".encode("utf-16-le"), 6),
        (b"\xfe\xff" + "ok".encode("utf-16-be") + b"\xdc\x00", 6),
        (b"\xff\xfe" + "odd".encode("utf-16-le") + b"!", 8),
    ],
    ids=["unpaired-high-surrogate", "lone-low-surrogate", "odd-length"],
)
def test_broken_utf16_is_a_typed_error(data, position):
    with pytest.raises(InvalidText, match="not valid UTF-16.*iconv") as info:
        parse_bytes(data, filename="u16.txt")
    assert info.value.details["position"] == position


# --- FIFOs ----------------------------------------------------------------------------------


def run_guarded(fifo: Path, function, seconds: float = 10):
    """Run ``function`` in a thread; if it blocks on the FIFO, unblock it and fail."""
    result: dict = {}

    def target():
        try:
            result["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # gives the reader an EOF
        os.close(writer)
        thread.join(seconds)
        pytest.fail(f"blocked on the FIFO {fifo}")
    return result


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_parse_file_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "x.txt"
    os.mkfifo(fifo)
    result = run_guarded(fifo, lambda: parse_file(fifo))
    assert isinstance(result.get("error"), FileNotFound)
    assert "not a regular file" in str(result["error"])


# --- M7: rag_ingest goes on after a failure ------------------------------------------------


def run_command(*args):
    out, err = StringIO(), StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue(), err.getvalue(), exc
    return out.getvalue(), err.getvalue(), None


@pytest.mark.django_db
@pytest.mark.parametrize("quiet", [False, True])
def test_rag_ingest_reports_a_failure_once_and_goes_on(tmp_path, quiet):
    from django_rag.models import Document

    (tmp_path / "a_broken.txt").write_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")
    (tmp_path / "b_good.txt").write_text("Refunds are paid within 14 days.")
    (tmp_path / "c_image.gif").write_bytes(b"\x89PNG")
    (tmp_path / "d_notes.xyz").write_text("unsupported")
    out, err, error = run_command(
        "rag_ingest", str(tmp_path), "--collection", "hostile", *(["--quiet"] if quiet else [])
    )
    assert error is not None and error.returncode == 1
    assert "a_broken.txt" in str(error)
    everything = out + err + str(error)
    assert everything.count("not valid UTF-16") == 1
    assert "2 file(s): 1 ingested" in out and "1 failed" in out
    assert "2 other file(s) in the directories skipped" in out
    assert Document.objects.filter(collection__name="hostile").count() == 1


@pytest.mark.django_db
def test_rag_ingest_lists_unsupported_files_at_verbosity_2(tmp_path):
    (tmp_path / "good.md").write_text("# Title\n\nbody text")
    (tmp_path / "image.gif").write_bytes(b"\x89PNG")
    out, _, error = run_command("rag_ingest", str(tmp_path), "-v", "2")
    assert error is None
    assert f"skipped {tmp_path / 'image.gif'}: no parser for this file type" in out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_rag_ingest_skips_a_fifo(tmp_path):
    fifo = tmp_path / "x.txt"
    os.mkfifo(fifo)
    result = run_guarded(fifo, lambda: run_command("rag_ingest", str(fifo)))
    assert "error" not in result, result.get("error")
    out, _, error = result["value"]
    assert error is None
    assert f"skipped {fifo}: not a regular file" in out
    assert "1 file(s): 0 ingested" in out and "1 skipped (not a regular file)" in out

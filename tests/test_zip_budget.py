"""Archives are measured by what they inflate, never by what they declare (issue 34).

A ZIP's directory states each member's size; Python's zipfile inflates up to 2 GiB of a member
in one call before cutting it to that size (and passes the CRC check when the CRC is that of the
cut bytes). Here archives lie about their sizes, both ways, and every member must either come out
exactly as it is or be refused with a typed error, with no more than the budget ever inflated by
anyone (the zlib calls of the whole process are counted). Real DOCX, XLSX and PPTX files whose
part inflates to 200 MB of zeros while declaring its true XML's size are parsed in a fresh
process, whose peak memory is measured; so are emails carrying them and a one-line 30 MB CSV.
"""

from __future__ import annotations

import email
import email.policy
import io
import struct
import zipfile
import zlib
from email.message import EmailMessage
from importlib.util import find_spec

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_rag.exceptions import CorruptFile, DocumentTooLarge
from django_rag.ingestion.archives import open_zip, read_member
from django_rag.ingestion.parsers import parse_bytes

MiB = 1024 * 1024


def needs(module: str, extra: str):
    return pytest.mark.skipif(
        find_spec(module) is None, reason=f"the {extra} extra ({module}) is not installed"
    )


# --- building archives that lie ---------------------------------------------------------------


def deflate_pieces(pieces: list[tuple[bytes, int]]) -> bytes:
    """Raw deflate data of each ``(block, copies)`` in turn, made without compressing the
    repeats (one compressed piece per block, ended by a full flush, repeated): 200 MB of zeros
    is about 200 KB and costs one compressed MiB to build."""
    out = bytearray()
    for block, copies in pieces:
        raw = zlib.compressobj(9, zlib.DEFLATED, -15)
        out += (raw.compress(block) + raw.flush(zlib.Z_FULL_FLUSH)) * copies
    return bytes(out + zlib.compressobj(9, zlib.DEFLATED, -15).flush())


def zip_members(members: list[tuple[str, int, bytes, int, int]]) -> bytes:
    """A ZIP of ``(name, method, data, crc, declared size)`` members: ``data`` is stored as it
    is, and both the local header and the central directory declare ``declared size``."""
    out, directory = bytearray(), bytearray()
    for name, method, data, crc, declared in members:
        encoded = name.encode()
        header = struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), declared,
            len(encoded), 0,
        )  # fmt: skip
        directory += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(data),
            declared, len(encoded), 0, 0, 0, 0, 0, len(out),
        )  # fmt: skip
        directory += encoded
        out += header + encoded + data
    end = struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory), len(out), 0
    )
    return bytes(out + directory + end)


def honest(name: str, content: bytes) -> tuple[str, int, bytes, int, int]:
    return (
        name,
        zipfile.ZIP_DEFLATED,
        deflate_pieces([(content, 1)]),
        zlib.crc32(content),
        len(content),
    )


ZEROS = b"\0" * MiB


def with_lying_part(data: bytes, part: str, zeros_mib: int = 200) -> bytes:
    """The Office file ``data`` with ``part`` followed by ``zeros_mib`` MiB of zeros in its
    deflate stream, while the directory declares the part's true size and CRC: zipfile read it
    whole (inflating everything first) and passed the check."""
    source = zipfile.ZipFile(io.BytesIO(data))
    members = []
    for info in source.infolist():
        content = source.read(info)
        if info.filename == part:
            stream = deflate_pieces([(content, 1), (ZEROS, zeros_mib)])
            members.append((part, 8, stream, zlib.crc32(content), len(content)))
        else:
            members.append(honest(info.filename, content))
    return zip_members(members)


def docx_file(text: str = "Refunds take 14 days.") -> bytes:
    import docx

    document = docx.Document()
    document.add_paragraph(text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def xlsx_file() -> bytes:
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.active.append(["plan", "price"])
    workbook.active.append(["basic", 10])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def pptx_file() -> bytes:
    import pptx

    deck = pptx.Presentation()
    deck.slides.add_slide(deck.slide_layouts[5]).shapes.title.text = "Quarterly plan"
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def lying_docx() -> bytes:
    """About 200 KB: word/document.xml declares its 1.6 KB but inflates to 200 MB."""
    return with_lying_part(docx_file(), "word/document.xml")


def lying_xlsx() -> bytes:
    return with_lying_part(xlsx_file(), "xl/workbook.xml")


def lying_pptx() -> bytes:
    return with_lying_part(pptx_file(), "ppt/slides/slide1.xml")


def email_with(name: str, content: bytes, *, subject: str = "Numbers") -> bytes:
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = "a@example.org"
    message.set_content("See attached.")
    message.add_attachment(content, maintype="application", subtype="octet-stream", filename=name)
    return bytes(message)


def eml_with_lying_docx() -> bytes:
    return email_with("numbers.docx", lying_docx())


def eml_in_eml_with_lying_docx() -> bytes:
    """An email attached (as message/rfc822) to an email, carrying the lying DOCX."""
    inner = email.message_from_bytes(eml_with_lying_docx(), policy=email.policy.default)
    outer = EmailMessage()
    outer["Subject"] = "Fwd: Numbers"
    outer.set_content("Forwarded.")
    outer.add_attachment(inner)
    return bytes(outer)


def docx_holding_a_lying_docx() -> bytes:
    """A DOCX with an embedded object that is itself the lying DOCX: a nested archive. The outer
    member is honest (200 KB), and no one opens the inner archive."""
    source = zipfile.ZipFile(io.BytesIO(docx_file("The outer document.")))
    members = [honest(info.filename, source.read(info)) for info in source.infolist()]
    members.append(honest("word/embeddings/inner.docx", lying_docx()))
    return zip_members(members)


def docx_whose_lying_member_is_a_docx() -> bytes:
    """A DOCX whose embedded DOCX member lies: it declares the inner file's size and goes on
    into 200 MB of zeros."""
    source = zipfile.ZipFile(io.BytesIO(docx_file("The outer document.")))
    members = [honest(info.filename, source.read(info)) for info in source.infolist()]
    inner = docx_file("inner")
    stream = deflate_pieces([(inner, 1), (ZEROS, 200)])
    members.append(("word/embeddings/inner.docx", 8, stream, zlib.crc32(inner), len(inner)))
    return zip_members(members)


def csv_one_line() -> bytes:
    """30 MB on one line: 15 million one-letter fields."""
    return b"a," * (15 * MiB)


def run_bounded(builder: str, extension: str, settings: dict | None = None) -> dict:
    """Parse ``builder()``'s file in a fresh process: its outcome and peak memory (VmHWM, the
    peak resident set, building the file included)."""
    from tests.helpers import parse_in_bounded_child

    return parse_in_bounded_child("tests.test_zip_budget", builder, extension, settings)


# --- the counting reader, property-based ------------------------------------------------------


class InflationSpy:
    """Counts every byte zlib inflates in this process while active (our reader's and any
    zipfile's alike), by wrapping ``zlib.decompressobj``."""

    def __init__(self):
        self.inflated = 0
        self._original = zlib.decompressobj

    def __enter__(self):
        spy = self

        class Counting:
            def __init__(self, *args, **kwargs):
                self._inner = spy._original(*args, **kwargs)

            def decompress(self, data, max_length=0):
                out = self._inner.decompress(data, max_length)
                spy.inflated += len(out)
                return out

            def flush(self, *args):
                out = self._inner.flush(*args)
                spy.inflated += len(out)
                return out

            def __getattr__(self, name):
                return getattr(self._inner, name)

        zlib.decompressobj = Counting
        return self

    def __exit__(self, *exc):
        zlib.decompressobj = self._original


@st.composite
def lying_archives(draw):
    """Up to 4 members of up to 192 KB (a short block repeated: from incompressible to 3,000
    times smaller), deflated or stored, each declaring its true size, less (its CRC that of the
    whole content or, zipfile's trap, of the declared prefix) or more, or a wrong CRC."""
    members, contents = [], []
    for index in range(draw(st.integers(1, 4))):
        block = draw(st.binary(min_size=1, max_size=64))
        content = block * draw(st.integers(1, 3_000))
        method = draw(st.sampled_from([zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED, 0]))
        lie = draw(
            st.sampled_from(["honest", "smaller", "smaller, CRC of the cut", "larger", "bad CRC"])
        )
        declared, crc = len(content), zlib.crc32(content) ^ (lie == "bad CRC")
        if lie.startswith("smaller"):
            declared = draw(st.integers(0, len(content) - 1))
            if lie.endswith("cut"):
                crc = zlib.crc32(content[:declared])
        elif lie == "larger":
            declared += draw(st.integers(1, 10**7))
        data = deflate_pieces([(content, 1)]) if method else content
        members.append((f"part{index}.xml", method, data, crc, declared))
        contents.append(content)
    return members, contents


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    archive=lying_archives(),
    budget=st.sampled_from([1_000, 100_000, 400_000, 10**9]),
    ratio=st.sampled_from([None, 100]),
)
def test_members_come_out_whole_or_are_refused_never_over_the_budget(archive, budget, ratio):
    members, contents = archive
    data = zip_members(members)
    with (
        override_settings(
            DJANGO_RAG={"MAX_ZIP_UNCOMPRESSED_BYTES": budget, "MAX_ZIP_RATIO": ratio}
        ),
        InflationSpy() as spy,
    ):
        try:
            with open_zip(data, filename="lying.zip") as opened:
                read = [read_member(opened, m[0], filename="lying.zip") for m in members]
            outcome = None
        except (CorruptFile, DocumentTooLarge) as exc:
            outcome = exc
    # Never more inflated than the budget (plus the one byte per member that shows a lie),
    # nor than each member's declared size allows.
    assert spy.inflated <= budget + len(members)
    assert spy.inflated <= sum(
        min(len(c), m[4] + 1) for m, c in zip(members, contents, strict=True)
    )
    event(type(outcome).__name__ if outcome else "read whole")
    understated = any(m[4] < len(c) for m, c in zip(members, contents, strict=True))
    if outcome is None:
        assert read == contents  # every member exactly as it is
        assert not understated  # zipfile's trap (a cut member whose CRC matches) never passes
        assert all(m[3] == zlib.crc32(c) for m, c in zip(members, contents, strict=True))
    honest = all(
        m[4] == len(c) and m[3] == zlib.crc32(c) for m, c in zip(members, contents, strict=True)
    )
    if honest and sum(map(len, contents)) <= budget:
        assert outcome is None, outcome  # no false refusal


def test_stored_members_duplicates_encryption_and_other_methods(settings):
    content = b"<x>stored</x>"
    stored = ("a.xml", 0, content, zlib.crc32(content), len(content))
    with open_zip(zip_members([stored]), filename="s.zip") as archive:
        assert read_member(archive, "a.xml", filename="s.zip") == content
    with pytest.raises(DocumentTooLarge, match="inflates past the 3 bytes"):
        open_zip(zip_members([(*stored[:4], 3)]), filename="s.zip")
    with pytest.raises(CorruptFile, match="names it twice"):
        open_zip(zip_members([stored, stored]), filename="twice.zip")
    bzip2 = ("a.xml", zipfile.ZIP_BZIP2, b"BZh9", 0, 10)
    with pytest.raises(CorruptFile, match="compression method 12"):
        open_zip(zip_members([bzip2]), filename="bz.zip")
    encrypted = bytearray(zip_members([stored]))
    encrypted[6] |= 1  # the local header's flags
    encrypted[encrypted.index(b"PK\x01\x02") + 8] |= 1  # the directory's
    with pytest.raises(CorruptFile, match="encrypted"):
        open_zip(bytes(encrypted), filename="secret.zip")
    cut = honest("a.xml", b"<x>" * 1000)
    with pytest.raises(CorruptFile, match="ends too soon|cut short|could not be read"):
        open_zip(zip_members([(cut[0], 8, cut[2][:20], *cut[3:])]), filename="cut.zip")


# --- lying Office files, emails and nested archives ------------------------------------------

LYING = [
    ("lying_docx", ".docx", "word/document.xml", ("docx", "docx")),
    ("lying_xlsx", ".xlsx", "xl/workbook.xml", ("openpyxl", "xlsx")),
    ("lying_pptx", ".pptx", "ppt/slides/slide1.xml", ("pptx", "pptx")),
]


@pytest.mark.parametrize("builder, extension, part, extra", LYING, ids=[c[0] for c in LYING])
def test_a_lying_office_file_is_refused_once_its_part_passes_its_declared_size(
    builder, extension, part, extra
):
    """Before: zipfile inflated the 200 MB, cut it to the declared size, found the CRC right,
    and the file was parsed (457 MB peak; 2,107 MB with 2 GB of zeros). Now the part is
    stopped one byte past its declared size: a few KB inflated."""
    if find_spec(extra[0]) is None:
        pytest.skip(f"the {extra[1]} extra is not installed")
    data = globals()[builder]()
    assert len(data) < 300_000
    with InflationSpy() as spy, pytest.raises(DocumentTooLarge, match="inflates past") as info:
        parse_bytes(data, filename=f"liar{extension}")
    assert info.value.details["member"] == part
    assert info.value.code == "document_too_large"
    # The other parts in full, this one up to its declared size and a byte.
    assert spy.inflated < 200_000


def docx_with_paragraph(size: int) -> bytes:
    import random

    rng = random.Random(size)
    return docx_file("".join(rng.choice("abcdefgh ") for _ in range(size)))


@needs("docx", "docx")
def test_attachments_inflate_from_one_budget_per_parse(settings):
    """An email's archives share MAX_ZIP_UNCOMPRESSED_BYTES: two DOCX each within it alone
    are refused together."""
    attachment = docx_with_paragraph(60_000)
    inflated = sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(attachment)).infolist())
    settings.DJANGO_RAG = {"MAX_ZIP_UNCOMPRESSED_BYTES": inflated * 3 // 2}
    assert parse_bytes(email_with("one.docx", attachment), filename="one.eml").text
    message = EmailMessage()
    message["Subject"] = "Two"
    message.set_content("Both attached.")
    for name in ("a.docx", "b.docx"):
        message.add_attachment(
            attachment, maintype="application", subtype="octet-stream", filename=name
        )
    with pytest.raises(DocumentTooLarge, match="spent by this parse already") as info:
        parse_bytes(bytes(message), filename="two.eml")
    assert info.value.details["setting"] == "MAX_ZIP_UNCOMPRESSED_BYTES"
    # Each parse starts afresh.
    assert parse_bytes(attachment, filename="a.docx").text


@needs("docx", "docx")
def test_a_nested_archive_is_counted_where_it_is_inflated():
    """An embedded DOCX is one member of the outer archive: inflated (and counted) as such,
    never opened; when its own entry lies, the outer reader stops it."""
    parsed = parse_bytes(docx_holding_a_lying_docx(), filename="outer.docx")
    assert parsed.text == "The outer document."
    with pytest.raises(DocumentTooLarge, match="word/embeddings/inner.docx"):
        parse_bytes(docx_whose_lying_member_is_a_docx(), filename="outer.docx")


# builder, extension, the module its parser needs, expected outcome
BOUNDED = [
    ("lying_docx", ".docx", "docx", "document_too_large"),
    ("lying_xlsx", ".xlsx", "openpyxl", "document_too_large"),
    ("lying_pptx", ".pptx", "pptx", "document_too_large"),
    ("eml_with_lying_docx", ".eml", "docx", "document_too_large"),
    ("eml_in_eml_with_lying_docx", ".eml", "docx", "document_too_large"),
    ("docx_whose_lying_member_is_a_docx", ".docx", "docx", "document_too_large"),
    ("docx_holding_a_lying_docx", ".docx", "docx", "parsed"),
    ("csv_one_line", ".csv", "csv", "document_too_large"),
]


@pytest.mark.parametrize(
    "builder, extension, module, outcome", BOUNDED, ids=[c[0] for c in BOUNDED]
)
def test_peak_memory_of_a_parse_stays_bounded(builder, extension, module, outcome):
    """In a fresh process (address space fenced at 4 GiB): the typed refusal, and a peak
    resident set under 300 MB, building the file included. Before: 457-470 MB for the
    200 MB lies (all parsed), 753 MB and 15 s for the CSV."""
    if find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    result = run_bounded(builder, extension)
    assert result["outcome"] == outcome, result
    assert result["peak_mb"] < 300, result


# --- CSV rows are bounded before they are read ------------------------------------------------

csv_fields = st.text(alphabet=st.sampled_from('ab ,;"\r\n\t'), max_size=12)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(csv_fields, max_size=5), max_size=8), raw=st.booleans())
def test_csv_lines_split_where_the_csv_module_splits_them(rows, raw):
    """The bounded line reader hands csv the lines io.StringIO(newline="") would: the same
    rows, whatever quotes and line ends (\\r, \\n, \\r\\n, inside quotes too)."""
    import csv

    from django_rag.ingestion.parsers.spreadsheet import _BoundedLines

    if raw:  # not necessarily valid CSV
        text = "".join("".join(row) for row in rows)
    else:
        buffer = io.StringIO(newline="")
        csv.writer(buffer, lineterminator="\r\n").writerows(rows)
        text = buffer.getvalue()

    def read(lines):
        try:
            return list(csv.reader(lines))
        except csv.Error as exc:
            return str(exc)

    bounded = _BoundedLines(text, limit=10**6, filename="x.csv")
    assert read(bounded) == read(io.StringIO(text, newline=""))


def test_a_csv_row_over_the_limit_is_refused_before_it_is_read(monkeypatch):
    from django_rag.ingestion.parsers import spreadsheet

    monkeypatch.setattr(spreadsheet, "MAX_CSV_ROW_CHARS", 100)
    ok = b"name,notes\r\nAda," + b"x" * 80 + b"\r\n"
    assert parse_bytes(ok, filename="ok.csv").metadata["rows"] == 1
    with pytest.raises(DocumentTooLarge, match="row reaching line 2 is longer than 100") as info:
        parse_bytes(b"name,notes\nAda," + b"x" * 200 + b"\n", filename="long.csv")
    assert info.value.details == {"filename": "long.csv", "line": 2, "limit": 100}
    # A row spanning lines (a quoted field) counts all of them.
    quoted = b'name,notes\nAda,"' + b"line\n" * 30 + b'"\n'
    with pytest.raises(DocumentTooLarge, match="line 21"):
        parse_bytes(quoted, filename="quoted.csv")
    # Rows are counted apart: many short rows are fine.
    assert parse_bytes(b"a,b\n" + b"1,2\n" * 1_000, filename="many.csv").metadata["rows"] == 1_000

"""Parsers turn file bytes into text (and page spans), chosen by file extension.

The registry maps extensions to parser classes. A host extends or disables entries with
``DJANGO_RAG["PARSERS"] = {".html": "myapp.parsers.HtmlParser", ".pdf": None}``.
"""

from __future__ import annotations

import bisect
import mimetypes
import os
import re
import stat
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..conf import get_setting, import_string
from ..exceptions import (
    ConfigurationError,
    CorruptFile,
    DocumentTooLarge,
    EncryptedPDF,
    FileNotFound,
    InvalidParserOutput,
    InvalidText,
    MissingDependency,
    UnsupportedFileType,
)
from .ocr import ScannedPages
from .pdftext import (
    MAX_LAYOUT_CHARS,
    blocks_from_dict,
    hyphenated_words,
    page_text,
    reading_order,
    restore_hyphens,
)
from .titles import pdf_title


@dataclass
class Page:
    number: int  # 1-based
    start: int  # character offsets into ParsedDocument.text
    end: int


@dataclass
class ParsedDocument:
    text: str
    format: str = "text"  # how the chunker should read it: "text" or "markdown"
    content_type: str = "text/plain"
    title: str = ""
    pages: list[Page] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def page_range(self, start: int | None, end: int | None) -> tuple[int | None, int | None]:
        """Pages holding characters ``start`` .. ``end - 1`` (None, None without pages)."""
        if not self.pages or start is None or end is None:
            return None, None
        starts = [page.start for page in self.pages]

        def page_at(offset: int) -> int:
            index = max(0, bisect.bisect_right(starts, offset) - 1)
            return self.pages[index].number

        return page_at(start), page_at(max(start, end - 1))


class Parser:
    """Base class: implement :meth:`parse`. ``__init__`` takes keyword options only."""

    content_type = "application/octet-stream"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        raise NotImplementedError

    def max_input_bytes(self) -> int | None:
        """The largest input worth reading (None: no limit); larger files are refused unread."""
        return None


def check_input_size(parser: Parser, size: int, *, filename: str) -> None:
    """Raise :class:`DocumentTooLarge` when ``size`` bytes exceed the parser's input budget."""
    limit = parser.max_input_bytes() if hasattr(parser, "max_input_bytes") else None
    if limit is not None and size > limit:
        raise DocumentTooLarge(
            f"{filename} has {size:,} bytes: more than MAX_DOCUMENT_CHARS characters even at 4 "
            f"bytes a character ({limit:,} bytes), so it was refused unread. Split it into "
            "several documents, or raise DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
            filename=filename,
            setting="MAX_DOCUMENT_CHARS",
            size=size,
            limit=limit,
        )


def decode_text(data: bytes, *, filename: str) -> str:
    """Decode UTF-8 (with or without BOM) or BOM-marked UTF-16; anything else is an error."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise InvalidText(
                f"{filename} starts with a UTF-16 byte order mark but is not valid UTF-16 "
                f"(bytes {exc.start}-{exc.end - 1}: {exc.reason}); it is truncated or damaged. "
                "Re-export it as UTF-8, or drop the broken characters with: "
                "iconv -c -f utf-16 -t utf-8 in.txt > out.txt",
                filename=filename,
                position=exc.start,
            ) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidText(
            f"{filename} is not valid UTF-8 (byte {exc.start} is 0x{data[exc.start]:02x}). "
            "Convert it to UTF-8 first, for example: iconv -f latin1 -t utf-8 in.txt > out.txt",
            filename=filename,
            position=exc.start,
        ) from exc


def _limit(name: str, *, integer: bool = True) -> int | float | None:
    """A budget setting: a positive number, or None for no limit."""
    value = get_setting(name)
    if value is None:
        return None
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        what = "integer" if integer else "number"
        raise ConfigurationError(name, value, f"must be a positive {what}, or None for no limit")
    return value


def _too_many_chars(filename: str, length: int, limit: int, *, where: str = "") -> DocumentTooLarge:
    return DocumentTooLarge(
        f"{filename}{where} has more than MAX_DOCUMENT_CHARS ({limit:,}) characters "
        f"({length:,} so far). Split it into several documents, or raise "
        "DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
        filename=filename,
        setting="MAX_DOCUMENT_CHARS",
        length=length,
        limit=limit,
    )


class TextParser(Parser):
    content_type = "text/plain"

    def max_input_bytes(self) -> int | None:
        """Inputs larger than this cannot fit MAX_DOCUMENT_CHARS: refused before decoding.

        UTF-8 and UTF-16 both spend at most 4 bytes on a character, plus a byte order mark.
        """
        limit = _limit("MAX_DOCUMENT_CHARS")
        return None if limit is None else 4 * limit + 4

    def decode(self, data: bytes, *, filename: str) -> str:
        check_input_size(self, len(data), filename=filename)
        return decode_text(data, filename=filename)

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        return ParsedDocument(
            text=self.decode(data, filename=filename), content_type=self.content_type
        )


def markdown_title(text: str) -> str:
    """The text of the first non-empty level-1 ATX heading (``# Title``), or "".

    Follows CommonMark: up to 3 spaces of indentation, ``#`` then a space, tab or the line end,
    and an optional closing run of ``#`` preceded by a space. Runs in linear time on any input
    (a regular expression with adjacent ``\\s*`` and ``#*`` backtracked cubically on a heading
    followed by many spaces): each line is visited once, and only lines holding a ``#``.
    """
    position, length = 0, len(text)
    while position < length:
        hash_at = text.find("#", position)
        if hash_at < 0:
            return ""
        newline = text.rfind("\n", position, hash_at)
        line_start = position if newline < 0 else newline + 1
        line_end = text.find("\n", hash_at)
        if line_end < 0:
            line_end = length
        position = line_end + 1
        indent = hash_at - line_start
        if indent > 3 or text.count(" ", line_start, hash_at) != indent:
            continue
        after = hash_at + 1
        if after < line_end and text[after] not in " \t\r":
            continue  # "##..." (a lower level) or "#word" (not a heading)
        content = text[after:line_end].strip()
        if content.endswith("#"):
            kept = content.rstrip("#")
            if not kept or kept[-1] in " \t":
                content = kept.rstrip()
        if content:
            return content[:500]
    return ""


class MarkdownParser(TextParser):
    content_type = "text/markdown"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        text = self.decode(data, filename=filename)
        return ParsedDocument(
            text=text,
            format="markdown",
            content_type=self.content_type,
            title=markdown_title(text),
        )


# A call of a named resource in a content stream: "/Name Do" (an XObject), "/Name scn" or
# "/Name SCN" (a pattern), "/Name gs" (a graphics state, whose soft mask is a form) and
# "/Tag /Name BDC" (marked content whose property list may carry an ActualText). Bounded,
# disjoint quantifiers (name characters exclude whitespace), so matching stays linear.
_NAMED_CALL = re.compile(
    rb"/([^\s/\[\]()<>{}%]{1,127})\s{1,32}(Do|scn|SCN|gs|BDC)(?![^\s/\[\]()<>{}%])"
)
_CATEGORY = {
    b"Do": "XObject",
    b"scn": "Pattern",
    b"SCN": "Pattern",
    b"gs": "ExtGState",
    b"BDC": "Properties",
}
_CATEGORIES = ("XObject", "Pattern", "ExtGState", "Properties")
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_REFERENCE = re.compile(r"(\d{1,10}) \d{1,5} R")
_MAX_FORM_DEPTH = 16
# MuPDF maps one character code to at most this many characters (longer ToUnicode
# destinations are ignored): the most a code can amplify.
MAX_CHARS_PER_CODE = 256
# A ToUnicode CMap larger than this (decoded) is not read: it is assumed to amplify fully.
_MAX_CMAP_BYTES = 4 * 1024 * 1024
# The tokens of a CMap that matter: parentheses and backslashes (literal strings, which nest),
# hex strings, and the keywords around mappings.
_CMAP_TOKEN = re.compile(rb"[()\\]|<[0-9A-Fa-f \t\r\n\f\x00]*>|beginbf|endbf")


def longest_cmap_string(data: bytes) -> int:
    """The most bytes a string inside the mappings (``beginbfchar`` / ``beginbfrange``
    sections) of a CMap holds: an upper bound (an escape counts in full).

    A ToUnicode CMap maps a code to the UTF-16 string of its destination, so its longest
    destination bounds the characters one code yields. Linear: one pass of a regular
    expression whose alternatives are disjoint, literal strings' nesting tracked by a counter
    (a keyword inside a string is part of the string, as for MuPDF).
    """
    longest = depth = start = 0
    inside = False
    skip = -1
    for match in _CMAP_TOKEN.finditer(data):
        at, token = match.start(), match.group()
        if at < skip:
            continue  # the character after a backslash
        if depth:
            if token == b"\\":
                skip = at + 2
            elif token == b"(":
                depth += 1
            elif token == b")":
                depth -= 1
                if not depth and inside:
                    longest = max(longest, at - start - 1)
            continue
        if token == b"(":
            depth, start = 1, at
        elif token == b"beginbf" or token == b"endbf":
            inside = token == b"beginbf"
        elif inside and token.startswith(b"<"):
            digits = len(token) - 2 - sum(token.count(c) for c in (b" ", b"\t", b"\r", b"\n"))
            longest = max(longest, (digits + 1) // 2)
    if depth and inside:  # an unterminated string runs to the end
        longest = max(longest, len(data) - start - 1)
    return longest


class _PageCost:
    """What extracting one page's text would cost: bytes of drawing instructions interpreted,
    each weighted by the characters it can produce, plus the characters produced elsewhere.

    Text extraction (MuPDF) cannot be interrupted from Python and needs memory in proportion
    to what a page draws and to the characters it yields: a 600 KB file whose single page
    inflates to 200 MB of text operators used 6 GB; a 5.4 KB file whose font maps one code
    to 128 characters (a ToUnicode CMap) reached 11.8 GB. So each page is measured first,
    without keeping its data:

    - content streams are decoded through MuPDF's filters and discarded (``fz_skip``); each
      byte counts as many times as the most characters a font of its resources maps one
      code to (1 for ordinary fonts, up to :data:`MAX_CHARS_PER_CODE`);
    - every named resource a stream calls counts once per call: a Form XObject (``Do``), a
      tiling pattern (``scn``), a soft mask's form (``gs``) cost what their own streams cost,
      a marked-content property list (``BDC``) costs its ActualText's characters. A small
      form drawn a million times is seen for what it costs. A name the resources do not hold
      as written costs the most of its kind (a hostile name escape must not hide a call);
    - annotation appearance streams count too.

    Measuring stops once the budget is exceeded.
    """

    def __init__(self, document, budget: int):
        import pymupdf

        self.mupdf = pymupdf.mupdf
        self.document = document
        self.pdf = self.mupdf.pdf_document_from_fz_document(document.this)
        self.budget = budget
        self.stream_costs: dict[int, int] = {}
        self.font_amplification: dict[int, int] = {}  # by font object number, whole document
        self.amplification = 1  # the most seen so far, for the error message

    def decoded_size(self, xref: int, cap: int) -> int:
        try:
            stream = self.mupdf.pdf_open_stream_number(self.pdf, xref)
            return self.mupdf.fz_skip(stream, max(cap, 0) + 1)
        except Exception:
            # Not a stream, or a filter error: MuPDF's text extraction skips such data too.
            return 0

    def calls(self, xref: int, names: dict[str, dict[str, Any]]) -> Counter:
        """How often the stream calls each named resource: (category, name) -> count; a name
        the resources lack is counted under (category, None)."""
        try:
            data = self.document.xref_stream(xref) or b""  # size already checked: bounded
        except Exception:
            return Counter()
        calls: Counter = Counter()
        for match in _NAMED_CALL.finditer(data):
            name, operator = match.groups()
            if b"#" in name:
                name = _NAME_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), name)
            category = _CATEGORY[operator]
            text = name.decode("latin-1")
            calls[(category, text if text in names.get(category, {}) else None)] += 1
        return calls

    def entries(self, resources, category: str) -> dict[str, Any]:
        m = self.mupdf
        if resources is None:
            return {}
        table = m.pdf_dict_gets(resources, category)
        if not m.pdf_is_dict(table):
            return {}
        return {
            m.pdf_to_name(m.pdf_dict_get_key(table, i)): m.pdf_dict_get_val(table, i)
            for i in range(m.pdf_dict_len(table))
        }

    def cmap_amplification(self, cmap, depth: int = 0) -> int:
        m = self.mupdf
        number = m.pdf_to_num(cmap)
        if not m.pdf_is_stream(cmap) or not number:
            return 1  # a predefined CMap (Identity-H...): one character per code
        if self.decoded_size(number, _MAX_CMAP_BYTES) > _MAX_CMAP_BYTES:
            return MAX_CHARS_PER_CODE
        try:
            data = self.document.xref_stream(number) or b""
        except Exception:
            return 1
        amplification = max(1, longest_cmap_string(data) // 2)  # UTF-16: 2 bytes a char
        parent = m.pdf_dict_gets(cmap, "UseCMap")
        if depth < 4 and m.pdf_is_stream(parent):
            amplification = max(amplification, self.cmap_amplification(parent, depth + 1))
        return min(amplification, MAX_CHARS_PER_CODE)

    def characters_per_byte(self, resources) -> int:
        """The most characters one byte of a stream using ``resources`` can produce."""
        m = self.mupdf
        most = 1
        for font in self.entries(resources, "Font").values():
            number = m.pdf_to_num(font)
            if number not in self.font_amplification or not number:
                self.font_amplification[number] = self.cmap_amplification(
                    m.pdf_dict_gets(font, "ToUnicode")
                )
            most = max(most, self.font_amplification[number])
        self.amplification = max(self.amplification, most)
        return most

    def resources_of(self, holder, fallback):
        m = self.mupdf
        resources = m.pdf_dict_get_inheritable(holder, m.PDF_ENUM_NAME_Resources)
        # A form without resources uses its caller's (MuPDF does so).
        return resources if m.pdf_is_dict(resources) else fallback

    def stream(self, holder, fallback, depth: int, spent: int) -> int:
        """The cost of the content stream ``holder`` (a stream object), ``spent`` already
        counted on this page."""
        m = self.mupdf
        number = m.pdf_to_num(holder)
        if not number or not m.pdf_is_stream(holder):
            return 0
        resources = self.resources_of(holder, fallback)
        weight = self.characters_per_byte(resources)
        left = self.budget - spent
        total = self.decoded_size(number, left // weight) * weight
        if total > left:
            return total
        names = {category: self.entries(resources, category) for category in _CATEGORIES}
        for (category, name), count in self.calls(number, names).items():
            table = names.get(category, {})
            targets = table.values() if name is None else [table[name]]
            unit = max(
                (self.called(category, target, resources, depth) for target in targets),
                default=0,
            )
            total += count * unit
            if total > left:
                return total
        return total

    def called(self, category: str, target, resources, depth: int) -> int:
        """The cost of one call of a named resource."""
        m = self.mupdf
        if category == "Properties":
            actual = m.pdf_dict_gets(target, "ActualText")
            return len(m.pdf_to_text_string(actual)) if m.pdf_is_string(actual) else 0
        if category == "ExtGState":
            target = m.pdf_dict_getp(target, "SMask/G")
        elif category == "XObject" and m.pdf_to_name(m.pdf_dict_gets(target, "Subtype")) != "Form":
            return 0  # an image
        if depth >= _MAX_FORM_DEPTH or not m.pdf_is_stream(target):
            return 0  # a shading pattern, no soft mask
        number = m.pdf_to_num(target)
        if number not in self.stream_costs:
            self.stream_costs[number] = 0  # a form drawing itself: MuPDF stops that loop
            self.stream_costs[number] = self.stream(target, resources, depth + 1, 0)
        return self.stream_costs[number]

    def annotation_streams(self, page) -> list[int]:
        kind, value = self.document.xref_get_key(page.xref, "Annots")
        if kind == "xref":  # an indirect array
            value = self.document.xref_object(int(value.split()[0]), compressed=True)
        elif kind != "array":
            return []
        xrefs = []
        for annotation in _REFERENCE.findall(value or ""):
            kind, appearance = self.document.xref_get_key(int(annotation), "AP/N")
            if kind in ("xref", "dict"):
                xrefs.extend(int(ref) for ref in _REFERENCE.findall(appearance))
        return xrefs

    def __call__(self, page) -> int:
        m = self.mupdf
        self.stream_costs = {}  # forms without resources use the page's
        resources = self.resources_of(m.pdf_new_indirect(self.pdf, page.xref, 0), None)
        total = 0
        for xref in [*page.get_contents(), *self.annotation_streams(page)]:
            total += self.stream(m.pdf_new_indirect(self.pdf, xref, 0), resources, 0, total)
            if total > self.budget:
                return total
        return total


class PdfParser(Parser):
    """Extracts the text layer of a PDF with pymupdf, one page after another.

    Each page's text is cleaned into prose (see :mod:`django_rag.ingestion.pdftext`): columns
    read in order, wrapped lines joined, words hyphenated at a line end made whole again. Page
    spans are the offsets of each cleaned page, so chunks' page ranges stay exact.

    Encrypted PDFs (unless the empty password opens them), damaged files and PDFs without a text
    layer (scans) raise typed errors. Budgets are enforced while reading, so a hostile file is
    refused early with :class:`DocumentTooLarge`: ``MAX_PDF_PAGES`` (checked first),
    ``MAX_PDF_PAGE_CONTENT_BYTES`` (each page is measured before its text is extracted),
    ``MAX_DOCUMENT_CHARS`` (the text so far, after each page) and ``PARSE_TIMEOUT`` (seconds,
    before each page).
    """

    content_type = "application/pdf"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        try:
            import pymupdf
        except ImportError as exc:
            raise MissingDependency("pymupdf", "pdf", "Reading PDF files") from exc
        started = time.monotonic()
        max_chars = _limit("MAX_DOCUMENT_CHARS")
        max_pages = _limit("MAX_PDF_PAGES")
        max_page_bytes = _limit("MAX_PDF_PAGE_CONTENT_BYTES")
        timeout = _limit("PARSE_TIMEOUT", integer=False)
        if b"%PDF" not in data[:1024]:
            raise CorruptFile(
                f"{filename} is not a PDF (it does not start with %PDF); check the file or its "
                "extension.",
                filename=filename,
            )
        try:
            document = pymupdf.open(stream=data, filetype="pdf")
        except Exception as exc:  # pymupdf raises several types for damaged files
            raise CorruptFile(
                f"{filename} could not be opened as a PDF ({exc}); it may be truncated or damaged.",
                filename=filename,
            ) from exc
        with document:
            if document.page_count == 0:
                raise CorruptFile(
                    f"{filename} has no pages; it is damaged or not really a PDF.",
                    filename=filename,
                )
            if document.needs_pass and not document.authenticate(""):
                raise EncryptedPDF(
                    f"{filename} is password-protected. Decrypt it first (for example "
                    "qpdf --decrypt --password=... in.pdf out.pdf) and ingest the result.",
                    filename=filename,
                )
            page_count = document.page_count
            if max_pages is not None and page_count > max_pages:
                raise DocumentTooLarge(
                    f"{filename} has {page_count:,} pages, more than MAX_PDF_PAGES "
                    f"({max_pages:,}). Split it (for example qpdf --split-pages={max_pages} "
                    "in.pdf out.pdf) or raise DJANGO_RAG['MAX_PDF_PAGES'].",
                    filename=filename,
                    setting="MAX_PDF_PAGES",
                    pages=page_count,
                    limit=max_pages,
                )
            page_cost = _PageCost(document, max_page_bytes) if max_page_bytes else None
            # Ligatures ("ﬁ") are expanded: PostgreSQL's text search would not match "fine" in
            # "ﬁne". Images are not needed (they would cost memory).
            flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES
            compounds: set[str] = set()  # hyphenated words printed inside a line
            joins: list[tuple[int, str]] = []  # hyphens removed at line ends
            parts: list[str] = []
            pages: list[Page] = []
            first_page: list | None = None  # its blocks, in reading order, for the title
            scans = ScannedPages(filename, started=started, timeout=timeout)  # OCR (ocr.py)
            offset = 0
            for number, page in enumerate(document, start=1):
                elapsed = time.monotonic() - started
                if timeout is not None and elapsed > timeout:
                    raise DocumentTooLarge(
                        f"{filename}: reading its text took more than PARSE_TIMEOUT ({timeout} "
                        f"s); stopped before page {number} of {page_count}. Split the PDF, or "
                        "raise DJANGO_RAG['PARSE_TIMEOUT'] (seconds).",
                        filename=filename,
                        setting="PARSE_TIMEOUT",
                        page=number,
                        limit=timeout,
                    )
                try:
                    cost = page_cost(page) if page_cost else 0
                except Exception as exc:
                    raise CorruptFile(
                        f"{filename} is damaged: reading page {number} failed ({exc}).",
                        filename=filename,
                    ) from exc
                if page_cost and cost > max_page_bytes:
                    amplification = page_cost.amplification
                    raise DocumentTooLarge(
                        f"{filename}: page {number} draws more than MAX_PDF_PAGE_CONTENT_BYTES "
                        f"({max_page_bytes:,}) bytes of instructions"
                        + (
                            f", counting each byte for the {amplification} characters one "
                            "code of its fonts can produce"
                            if amplification > 1
                            else ""
                        )
                        + ", so its text was not extracted (that needs memory in proportion). "
                        "The file may be hostile; if it is not, raise "
                        "DJANGO_RAG['MAX_PDF_PAGE_CONTENT_BYTES'].",
                        filename=filename,
                        setting="MAX_PDF_PAGE_CONTENT_BYTES",
                        page=number,
                        limit=max_page_bytes,
                        characters_per_code=amplification,
                    )
                try:
                    textpage = page.get_textpage(flags=flags)
                    plain = textpage.extractText()
                    # The layout is read only for pages of a bounded size (MAX_LAYOUT_CHARS):
                    # its Python objects cost far more memory than the plain text.
                    layout = (
                        blocks_from_dict(textpage.extractDICT())
                        if len(plain) <= MAX_LAYOUT_CHARS
                        else None
                    )
                except Exception as exc:
                    raise CorruptFile(
                        f"{filename} is damaged: reading page {number} failed ({exc}).",
                        filename=filename,
                    ) from exc
                if parts:
                    parts.append("\n\n")
                    offset += 2
                if layout is None:
                    text = plain.replace("\x00", "").strip()
                else:
                    blocks = reading_order(layout)
                    if number == 1:
                        first_page = blocks
                    hyphenated_words(blocks, compounds)
                    cleaned = page_text(blocks)
                    text = cleaned.text
                    joins.extend((offset + at, key) for at, key in cleaned.joins)
                del textpage, plain, layout
                if not text:  # a scanned page: read by OCR, or recorded as not read
                    text = scans.read(page, number)
                pages.append(Page(number=number, start=offset, end=offset + len(text)))
                parts.append(text)
                offset += len(text)
                if max_chars is not None and offset > max_chars:
                    error = _too_many_chars(
                        filename, offset, max_chars, where=f" (pages 1-{number} of {page_count})"
                    )
                    error.details["page"] = number
                    raise error
            # A hyphen removed at a line end goes back where the document prints the same
            # word hyphenated elsewhere ("dual-" / "encoder" and "dual-encoder" on a later page).
            text, restored = restore_hyphens("".join(parts), joins, compounds)
            if restored:
                for span in pages:  # each hyphen put back shifts the pages after it
                    span.start += bisect.bisect_left(restored, span.start)
                    span.end += bisect.bisect_left(restored, span.end)
            if not text.strip():
                raise scans.no_text_error()
            title = (document.metadata or {}).get("title") or ""
            return ParsedDocument(
                text=text,
                content_type=self.content_type,
                # A file name or a tool's placeholder in the metadata loses to the heading.
                title=pdf_title(title if isinstance(title, str) else "", first_page, text),
                pages=pages,
                metadata={"page_count": page_count, **scans.metadata()},
            )


def check_parsed(parsed: Any, *, parser: Any, filename: str) -> ParsedDocument:
    """Return ``parsed`` when it can be stored as it is; otherwise raise
    :class:`~django_rag.exceptions.InvalidParserOutput` naming the parser.

    Every parse goes through here, built-in or custom, so a parser's bug is caught before its
    page spans turn into wrong page numbers on the stored chunks."""
    name = f"{type(parser).__module__}.{type(parser).__qualname__}"

    def fail(problem: str) -> InvalidParserOutput:
        return InvalidParserOutput(
            f"The parser {name} returned an invalid document for {filename!r}: {problem}. "
            "Fix the parser (docs/ingestion.md#custom-parsers).",
            parser=name,
            filename=filename,
        )

    if not isinstance(parsed, ParsedDocument):
        raise fail(f"expected a ParsedDocument, got {type(parsed).__name__}")
    for attribute in ("text", "title", "format", "content_type"):
        value = getattr(parsed, attribute)
        if not isinstance(value, str):
            raise fail(f"{attribute} must be a string, got {type(value).__name__}")
    if not isinstance(parsed.metadata, dict):
        raise fail(f"metadata must be a dict, got {type(parsed.metadata).__name__}")
    if not isinstance(parsed.pages, list):
        raise fail(f"pages must be a list of Page, got {type(parsed.pages).__name__}")
    length = len(parsed.text)
    previous: Page | None = None
    for index, page in enumerate(parsed.pages):
        if not isinstance(page, Page):
            raise fail(f"pages[{index}] is a {type(page).__name__}, not a Page")
        fields = (page.number, page.start, page.end)
        if any(not isinstance(v, int) or isinstance(v, bool) for v in fields):
            raise fail(f"pages[{index}] needs integer number, start and end, got {fields!r}")
        if page.number < 1:
            raise fail(f"pages[{index}] has number {page.number}; page numbers start at 1")
        if not 0 <= page.start <= page.end <= length:
            raise fail(
                f"pages[{index}] (page {page.number}) spans {page.start}..{page.end}, outside "
                f"the text (0..{length})"
            )
        if previous is not None:
            if page.number <= previous.number:
                raise fail(
                    f"page numbers must increase: page {page.number} follows page {previous.number}"
                )
            if page.start < previous.end:
                raise fail(
                    f"page {page.number} starts at {page.start}, inside page {previous.number} "
                    f"({previous.start}..{previous.end}); pages must be in text order and "
                    "not overlap"
                )
        previous = page
    return parsed


BUILTIN_PARSERS: dict[str, str] = {
    ".txt": "django_rag.ingestion.parsers.TextParser",
    ".text": "django_rag.ingestion.parsers.TextParser",
    ".md": "django_rag.ingestion.parsers.MarkdownParser",
    ".markdown": "django_rag.ingestion.parsers.MarkdownParser",
    ".pdf": "django_rag.ingestion.parsers.PdfParser",
}


def parser_registry() -> dict[str, Any]:
    """The effective extension -> parser mapping (built-ins updated by the PARSERS setting)."""
    configured = get_setting("PARSERS")
    if not isinstance(configured, dict):
        raise ConfigurationError("PARSERS", configured, "must be a dict of extension -> parser")
    registry = {**BUILTIN_PARSERS}
    for extension, parser in configured.items():
        key = extension.lower() if extension.startswith(".") else f".{extension.lower()}"
        registry[key] = parser
    return {ext: parser for ext, parser in registry.items() if parser is not None}


def get_parser(filename: str) -> Parser:
    extension = Path(filename).suffix.lower()
    registry = parser_registry()
    spec = registry.get(extension)
    if spec is None:
        raise UnsupportedFileType(
            f"No parser for {filename!r} (extension {extension or 'none'!r}). Supported: "
            f"{', '.join(sorted(registry))}. Add one with DJANGO_RAG['PARSERS'].",
            filename=filename,
        )
    if isinstance(spec, str):
        spec = import_string(spec, setting="PARSERS")
    if isinstance(spec, type) and issubclass(spec, Parser):
        return spec()
    if isinstance(spec, Parser):
        return spec
    raise ConfigurationError("PARSERS", spec, f"the parser for {extension} is not a Parser")


def parse_bytes(data: bytes, *, filename: str) -> ParsedDocument:
    parser = get_parser(filename)
    parsed = check_parsed(parser.parse(data, filename=filename), parser=parser, filename=filename)
    if not parsed.content_type or parsed.content_type == "application/octet-stream":
        parsed.content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    return parsed


def parse_file(path: str | Path) -> ParsedDocument:
    """Parse the file at ``path``; only regular files are read, and never more than needed."""
    path = Path(path)
    parser = get_parser(path.name)  # unsupported types fail before the file is read
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as exc:
        raise FileNotFound(f"No such file: {path}", path=str(path)) from exc
    except IsADirectoryError as exc:
        raise FileNotFound(f"{path} is a directory; pass files (or use rag_ingest).") from exc
    with open(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise FileNotFound(f"{path} is a directory; pass files (or use rag_ingest).")
        if not stat.S_ISREG(info.st_mode):
            raise FileNotFound(
                f"{path} is not a regular file (a FIFO, socket or device); copy its content to "
                "a file and ingest that.",
                path=str(path),
            )
        check_input_size(parser, info.st_size, filename=path.name)
        data = file.read()
    return parse_bytes(data, filename=path.name)

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
    InvalidText,
    MissingDependency,
    NoTextLayer,
    UnsupportedFileType,
)
from .pdftext import (
    MAX_LAYOUT_CHARS,
    blocks_from_dict,
    hyphenated_words,
    page_text,
    reading_order,
    restore_hyphens,
)


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


# A Form XObject call in a content stream: "/Name Do". Bounded, disjoint quantifiers (name
# characters exclude whitespace), so matching stays linear on hostile streams.
_FORM_CALL = re.compile(rb"/([^\s/\[\]()<>{}%]{1,127})\s{1,32}Do(?![^\s/\[\]()<>{}%])")
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_REFERENCE = re.compile(r"(\d{1,10}) \d{1,5} R")
_MAX_FORM_DEPTH = 16


class _PageCost:
    """Bytes of drawing instructions that extracting one page's text would interpret.

    Text extraction (MuPDF) cannot be interrupted from Python and needs memory in proportion
    to what a page draws: a 600 KB file whose single page inflates to 200 MB of text operators
    used 6 GB. So each page is measured first, without keeping its data: content streams are
    decoded through MuPDF's filters and discarded (``fz_skip``), Form XObjects count once per
    call (``/Name Do``) so a small form drawn a million times is seen for what it costs, and
    annotation appearance streams count too. Measuring stops once the budget is exceeded.
    """

    def __init__(self, document, budget: int):
        import pymupdf

        self.mupdf = pymupdf.mupdf
        self.document = document
        self.pdf = self.mupdf.pdf_document_from_fz_document(document.this)
        self.budget = budget
        self.form_costs: dict[int, int] = {}

    def decoded_size(self, xref: int, cap: int) -> int:
        try:
            stream = self.mupdf.pdf_open_stream_number(self.pdf, xref)
            return self.mupdf.fz_skip(stream, cap + 1)
        except Exception:
            # Not a stream, or a filter error: MuPDF's text extraction skips such data too.
            return 0

    def form_calls(self, xref: int) -> Counter:
        try:
            data = self.document.xref_stream(xref) or b""  # size already checked: bounded
        except Exception:
            return Counter()
        calls: Counter = Counter()
        for name in _FORM_CALL.findall(data):
            if b"#" in name:
                name = _NAME_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), name)
            calls[name.decode("latin-1")] += 1
        return calls

    def streams(self, xrefs, forms: dict[int, dict[str, int]], scope: int, depth: int) -> int:
        total = 0
        for xref in xrefs:
            total += self.decoded_size(xref, self.budget - total)
            if total > self.budget:
                return total
            names = forms.get(scope) or forms.get(0)  # a form without resources uses the page's
            if not names or depth >= _MAX_FORM_DEPTH:
                continue
            for name, count in self.form_calls(xref).items():
                child = names.get(name)
                if child is None:
                    continue  # an image, or an unknown name
                if child not in self.form_costs:
                    self.form_costs[child] = 0  # a form drawing itself: MuPDF stops that loop
                    self.form_costs[child] = self.streams([child], forms, child, depth + 1)
                total += count * self.form_costs[child]
                if total > self.budget:
                    return total
        return total

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
        self.form_costs = {}  # forms are scoped by the page's resources
        forms: dict[int, dict[str, int]] = {}
        for xref, name, invoker, _bbox in self.document.get_page_xobjects(page.number):
            forms.setdefault(invoker, {})[name] = xref
        total = self.streams(page.get_contents(), forms, 0, 0)
        if total <= self.budget:
            total += self.streams(self.annotation_streams(page), {}, 0, 0)
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
                    raise DocumentTooLarge(
                        f"{filename}: page {number} draws more than MAX_PDF_PAGE_CONTENT_BYTES "
                        f"({max_page_bytes:,}) bytes of instructions, so its text was not "
                        "extracted (that needs memory in proportion). The file may be hostile; "
                        "if it is not, raise DJANGO_RAG['MAX_PDF_PAGE_CONTENT_BYTES'].",
                        filename=filename,
                        setting="MAX_PDF_PAGE_CONTENT_BYTES",
                        page=number,
                        limit=max_page_bytes,
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
                    hyphenated_words(blocks, compounds)
                    cleaned = page_text(blocks)
                    text = cleaned.text
                    joins.extend((offset + at, key) for at, key in cleaned.joins)
                del textpage, plain, layout
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
                raise NoTextLayer(
                    f"{filename} has no text layer (it looks scanned or image-only). Run OCR "
                    "first, for example: ocrmypdf in.pdf out.pdf",
                    filename=filename,
                )
            title = (document.metadata or {}).get("title") or ""
            return ParsedDocument(
                text=text,
                content_type=self.content_type,
                title=title.strip()[:500],
                pages=pages,
                metadata={"page_count": page_count},
            )


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
    parsed = get_parser(filename).parse(data, filename=filename)
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

"""The parsers' shared value types and helpers: what a parse returns, the base class, budgets."""

from __future__ import annotations

import bisect
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from ...conf import get_setting
from ...exceptions import ConfigurationError, DocumentTooLarge, InvalidParserOutput, InvalidText


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


#: The content type a text given to ``ingest(text, format=...)`` is stored with, by format
#: (it goes through no parser; HTML is converted to Markdown first).
TEXT_CONTENT_TYPES = {"text": "text/plain", "markdown": "text/markdown", "html": "text/html"}


class Parser:
    """Base class: implement :meth:`parse`. ``__init__`` takes keyword options only."""

    content_type = "application/octet-stream"
    #: What :meth:`parse` hands the chunker: ``"markdown"`` (headings, tables) or ``"text"``.
    #: A parser that gives Markdown only sometimes says ``"text"`` (a PDF has Markdown only
    #: where it found tables). A stored document's chunk headers are rebuilt with it
    #: (``rag_maintenance headers``).
    format = "text"

    #: Optional packages the parser imports, as ``(module, extra, distribution)``: the
    #: registry refuses a file with :class:`~django_rag.exceptions.ParserUnavailable` naming
    #: the extra before the parser runs when one of them is not installed.
    requires: tuple[tuple[str, str, str], ...] = ()

    def missing(self) -> tuple[str, str] | None:
        """``(package, extra)`` of the first requirement that is not installed, or None when
        the parser can run. Looks the modules up without importing them. Override it for a
        need that is not a Python package (return what to install and the extra, or your own
        package name for both)."""
        for module, extra, distribution in self.requires:
            try:
                found = importlib.util.find_spec(module.split(".")[0]) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return distribution, extra
        return None

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        raise NotImplementedError

    def max_input_bytes(self) -> int | None:
        """The largest input worth reading (None: no limit); larger files are refused unread."""
        return None


def check_input_size(parser: Parser, size: int, *, filename: str) -> None:
    """Raise :class:`DocumentTooLarge` when ``size`` bytes exceed the parser's input budget."""
    limit = parser.max_input_bytes() if hasattr(parser, "max_input_bytes") else None
    if limit is not None and size > limit:
        if hasattr(parser, "input_too_large"):  # a parser whose limit is not about characters
            raise parser.input_too_large(size, limit, filename=filename)
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


def budget_setting(name: str, *, integer: bool = True) -> int | float | None:
    """A budget setting: a positive number, or None for no limit."""
    value = get_setting(name)
    if value is None:
        return None
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        what = "integer" if integer else "number"
        raise ConfigurationError(name, value, f"must be a positive {what}, or None for no limit")
    return value


def too_many_chars(filename: str, length: int, limit: int, *, where: str = "") -> DocumentTooLarge:
    return DocumentTooLarge(
        f"{filename}{where} has more than MAX_DOCUMENT_CHARS ({limit:,}) characters "
        f"({length:,} so far). Split it into several documents, or raise "
        "DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
        filename=filename,
        setting="MAX_DOCUMENT_CHARS",
        length=length,
        limit=limit,
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

"""Parsers turn file bytes into text (and page spans), chosen by file extension.

The registry maps extensions to parser classes. A host extends or disables entries with
``DJANGO_RAG["PARSERS"] = {".html": "myapp.parsers.HtmlParser", ".pdf": None}``.
"""

from __future__ import annotations

import bisect
import mimetypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..conf import get_setting, import_string
from ..exceptions import (
    ConfigurationError,
    CorruptFile,
    EncryptedPDF,
    FileNotFound,
    InvalidText,
    MissingDependency,
    NoTextLayer,
    UnsupportedFileType,
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


def decode_text(data: bytes, *, filename: str) -> str:
    """Decode UTF-8 (with or without BOM) or BOM-marked UTF-16; anything else is an error."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidText(
            f"{filename} is not valid UTF-8 (byte {exc.start} is 0x{data[exc.start]:02x}). "
            "Convert it to UTF-8 first, for example: iconv -f latin1 -t utf-8 in.txt > out.txt",
            filename=filename,
            position=exc.start,
        ) from exc


class TextParser(Parser):
    content_type = "text/plain"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        return ParsedDocument(
            text=decode_text(data, filename=filename), content_type=self.content_type
        )


_MD_TITLE = re.compile(r"^\s{0,3}#\s+(.+?)\s*#*\s*$", re.MULTILINE)


class MarkdownParser(Parser):
    content_type = "text/markdown"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        text = decode_text(data, filename=filename)
        match = _MD_TITLE.search(text)
        return ParsedDocument(
            text=text,
            format="markdown",
            content_type=self.content_type,
            title=match.group(1)[:500] if match else "",
        )


class PdfParser(Parser):
    """Extracts the text layer of a PDF with pymupdf, one page after another.

    Encrypted PDFs (unless the empty password opens them), damaged files and PDFs without a text
    layer (scans) raise typed errors.
    """

    content_type = "application/pdf"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        try:
            import pymupdf
        except ImportError as exc:
            raise MissingDependency("pymupdf", "pdf", "Reading PDF files") from exc
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
            parts: list[str] = []
            pages: list[Page] = []
            offset = 0
            try:
                for number, page in enumerate(document, start=1):
                    text = page.get_text("text").replace("\x00", "").strip()
                    if parts:
                        parts.append("\n\n")
                        offset += 2
                    pages.append(Page(number=number, start=offset, end=offset + len(text)))
                    parts.append(text)
                    offset += len(text)
            except Exception as exc:
                raise CorruptFile(
                    f"{filename} is damaged: reading page {len(pages) + 1} failed ({exc}).",
                    filename=filename,
                ) from exc
            text = "".join(parts)
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
                metadata={"page_count": document.page_count},
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
    path = Path(path)
    get_parser(path.name)  # unsupported types fail before the file is read
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise FileNotFound(f"No such file: {path}", path=str(path)) from exc
    except IsADirectoryError as exc:
        raise FileNotFound(f"{path} is a directory; pass files (or use rag_ingest).") from exc
    return parse_bytes(data, filename=path.name)

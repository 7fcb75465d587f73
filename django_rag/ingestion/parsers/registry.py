"""The registry: which parser reads which file extension, and the entry points that use it."""

from __future__ import annotations

import mimetypes
import os
import stat
from pathlib import Path
from typing import Any

from ...conf import get_setting, import_string
from ...exceptions import (
    ConfigurationError,
    FileNotFound,
    MissingDependency,
    UnsupportedFileType,
)
from .base import TEXT_CONTENT_TYPES, ParsedDocument, Parser, check_input_size, check_parsed

BUILTIN_PARSERS: dict[str, str] = {
    ".txt": "django_rag.ingestion.parsers.TextParser",
    ".text": "django_rag.ingestion.parsers.TextParser",
    ".md": "django_rag.ingestion.parsers.MarkdownParser",
    ".markdown": "django_rag.ingestion.parsers.MarkdownParser",
    ".pdf": "django_rag.ingestion.parsers.PdfParser",
    # Formats read by an optional extra's library: the module is imported when the parser is
    # first asked for, and parsing without the extra raises MissingDependency naming it.
    ".html": "django_rag.ingestion.parsers.html.HtmlParser",
    ".htm": "django_rag.ingestion.parsers.html.HtmlParser",
    ".docx": "django_rag.ingestion.parsers.docx.DocxParser",
    ".pptx": "django_rag.ingestion.parsers.pptx.PptxParser",
    ".xlsx": "django_rag.ingestion.parsers.spreadsheet.XlsxParser",
    ".xlsm": "django_rag.ingestion.parsers.spreadsheet.XlsxParser",
    ".eml": "django_rag.ingestion.parsers.mail.EmlParser",
    ".csv": "django_rag.ingestion.parsers.spreadsheet.CsvParser",
    ".tsv": "django_rag.ingestion.parsers.spreadsheet.CsvParser",
}
IMAGE_PARSER = "django_rag.ingestion.parsers.image.ImageParser"
# Images have no text but what OCR reads: they are registered only while an OCR engine is
# available (ocr.engine_name()), so without one a folder's photos are skipped as an unsupported
# type, and an upload of one is refused with UnsupportedFileType naming the ocr extra.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


def _ocr_available() -> bool:
    from ..ocr import engine_name

    try:
        return engine_name() is not None
    except MissingDependency:
        return True  # an engine named in OCR but absent: parsing says so, naming the extra


def parser_registry() -> dict[str, Any]:
    """The effective extension -> parser mapping (built-ins updated by the PARSERS setting)."""
    configured = get_setting("PARSERS")
    if not isinstance(configured, dict):
        raise ConfigurationError("PARSERS", configured, "must be a dict of extension -> parser")
    registry = {**BUILTIN_PARSERS}
    if _ocr_available():
        registry.update(dict.fromkeys(IMAGE_EXTENSIONS, IMAGE_PARSER))
    for extension, parser in configured.items():
        key = extension.lower() if extension.startswith(".") else f".{extension.lower()}"
        registry[key] = parser
    return {ext: parser for ext, parser in registry.items() if parser is not None}


def get_parser(filename: str) -> Parser:
    extension = Path(filename).suffix.lower()
    registry = parser_registry()
    spec = registry.get(extension)
    if spec is None:
        hint = "Add one with DJANGO_RAG['PARSERS']."
        if extension in IMAGE_EXTENSIONS:
            from ..ocr import no_engine_advice

            hint = f"Images are read by OCR, and no OCR engine is available: {no_engine_advice()}."
        raise UnsupportedFileType(
            f"No parser for {filename!r} (extension {extension or 'none'!r}). Supported: "
            f"{', '.join(sorted(registry))}. {hint}",
            filename=filename,
        )
    if isinstance(spec, str):
        spec = import_string(spec, setting="PARSERS")
    if isinstance(spec, type) and issubclass(spec, Parser):
        return spec()
    if isinstance(spec, Parser):
        return spec
    raise ConfigurationError("PARSERS", spec, f"the parser for {extension} is not a Parser")


def parser_formats() -> dict[str, str]:
    """``{content type: "markdown" or "text"}``: what a stored document of each content type
    was chunked as. A document keeps its content type, not its format: its chunk headers are
    rebuilt with this (``rag_maintenance headers``). Text given to ``ingest`` comes first
    (``TEXT_CONTENT_TYPES``: plain text is text, Markdown and HTML are chunked as Markdown),
    then each registered parser's :attr:`Parser.format`."""
    formats = {
        content_type: "text" if given == "text" else "markdown"
        for given, content_type in TEXT_CONTENT_TYPES.items()
    }
    for extension in parser_registry():
        parser = get_parser(f"x{extension}")
        formats.setdefault(parser.content_type, getattr(parser, "format", "text"))
    return formats


def parse_bytes(data: bytes, *, filename: str) -> ParsedDocument:
    """Parse ``data`` with the parser registered for ``filename``'s extension. Every archive
    the parse opens, however deep (an email's attachments), inflates from one
    ``MAX_ZIP_UNCOMPRESSED_BYTES`` budget."""
    from .archives import inflation_budget

    parser = get_parser(filename)
    with inflation_budget():
        parsed = parser.parse(data, filename=filename)
    parsed = check_parsed(parsed, parser=parser, filename=filename)
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

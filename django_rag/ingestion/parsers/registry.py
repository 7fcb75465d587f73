"""The registry: which parser reads which file extension, and the entry points that use it."""

from __future__ import annotations

import inspect
import mimetypes
import os
import stat
from pathlib import Path
from typing import Any

from ...conf import get_setting, import_string
from ...exceptions import (
    ConfigurationError,
    FileNotFound,
    InvalidOption,
    MissingDependency,
    ParserUnavailable,
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
    """The effective extension -> parser spec mapping (built-ins updated by the PARSERS
    setting, disabled extensions left out). A spec is a dotted path, a Parser class or
    instance, or a ``(parser, options)`` pair."""
    return {ext: spec for ext, spec in _configured().items() if spec is not None}


def _configured() -> dict[str, Any]:
    """Built-ins updated by PARSERS, with the extensions it disables (None) kept as None."""
    configured = get_setting("PARSERS")
    if not isinstance(configured, dict):
        raise ConfigurationError("PARSERS", configured, "must be a dict of extension -> parser")
    registry: dict[str, Any] = {**BUILTIN_PARSERS}
    if _ocr_available():
        registry.update(dict.fromkeys(IMAGE_EXTENSIONS, IMAGE_PARSER))
    for extension, parser in configured.items():
        if not isinstance(extension, str):
            raise ConfigurationError("PARSERS", configured, f"the key {extension!r} is not text")
        key = extension.lower() if extension.startswith(".") else f".{extension.lower()}"
        registry[key] = parser
    return registry


def supported_formats() -> list[str]:
    """The extensions a parser is registered for (built-ins and ``PARSERS``, less the ones it
    disables), sorted. ``FALLBACK_PARSER`` claims no extension of its own, so it adds none:
    folder walks pick files by this list."""
    return sorted(parser_registry())


def available(filename: str) -> bool:
    """Whether a file named ``filename`` (or an extension: ``".docx"``, ``"docx"``) would be
    parsed: a parser, registered or the fallback, claims it and its extras are installed."""
    if not isinstance(filename, str) or not filename:
        return False
    name = filename if "." in filename else f".{filename}"
    if name.startswith("."):
        name = f"x{name}"
    try:
        return get_parser(name, check_available=False).missing() is None
    except (UnsupportedFileType, ConfigurationError):
        return False


def _spec_parts(spec: Any, setting: str) -> tuple[Any, dict[str, Any]]:
    """``(parser, options)`` of a spec: a bare parser has no options."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2 or not isinstance(spec[1], dict):
            raise ConfigurationError(
                setting, spec, "a parser with options is a (parser, {option: value}) pair"
            )
        return spec[0], dict(spec[1])
    return spec, {}


def _build(spec: Any, options: dict[str, Any], given: dict[str, Any], *, setting: str, what: str):
    """The parser instance of ``spec`` with the setting's ``options`` merged under the
    per-call ``given`` ones (those win)."""
    if isinstance(spec, str):
        spec = import_string(spec, setting=setting)
    if isinstance(spec, Parser):
        if options or given:
            problem = "options need a Parser class (or its dotted path), not an instance"
            if given:
                raise InvalidOption(f"Parser options {sorted(given)} for {what}: {problem}.")
            raise ConfigurationError(setting, spec, problem)
        return spec
    if not (isinstance(spec, type) and issubclass(spec, Parser)):
        raise ConfigurationError(setting, spec, f"the parser for {what} is not a Parser")
    name = f"{spec.__module__}.{spec.__qualname__}"
    for merged, per_call in ((options, False), ({**options, **given}, True)):
        if per_call and not given:
            break
        try:
            inspect.signature(spec).bind(**merged)
        except TypeError as exc:
            if per_call:
                raise InvalidOption(
                    f"The parser {name} (for {what}) does not take the options "
                    f"{sorted(given)}: {exc}. See its keyword arguments."
                ) from None
            raise ConfigurationError(setting, options, f"{name} refuses them: {exc}") from None
    return spec(**{**options, **given})


def get_parser(
    filename: str, *, options: dict[str, Any] | None = None, check_available: bool = True
) -> Parser:
    """The parser for ``filename``: the one registered for its extension, else
    ``FALLBACK_PARSER``; an extension ``PARSERS`` disables (None) has none.

    ``options`` (per call) are merged over the options of the setting's ``(parser, options)``
    spec and passed to the parser class. Unless ``check_available`` is False, a parser whose
    extra is not installed raises :class:`~django_rag.exceptions.ParserUnavailable` here,
    before it runs."""
    if options is not None and not isinstance(options, dict):
        raise InvalidOption(f"Parser options must be a dict, got {type(options).__name__}.")
    extension = Path(filename).suffix.lower()
    configured = _configured()
    setting = "PARSERS"
    spec = configured.get(extension)
    if spec is None and extension not in configured:
        spec = get_setting("FALLBACK_PARSER")
        setting = "FALLBACK_PARSER"
    if spec is None:
        hint = "Add one with DJANGO_RAG['PARSERS'] (or a FALLBACK_PARSER)."
        if extension in configured:
            hint = "DJANGO_RAG['PARSERS'] disables this extension."
        elif extension in IMAGE_EXTENSIONS:
            from ..ocr import no_engine_advice

            hint = f"Images are read by OCR, and no OCR engine is available: {no_engine_advice()}."
        raise UnsupportedFileType(
            f"No parser for {filename!r} (extension {extension or 'none'!r}). Supported: "
            f"{', '.join(supported_formats())}. {hint}",
            filename=filename,
        )
    spec, spec_options = _spec_parts(spec, setting)
    parser = _build(
        spec, spec_options, options or {}, setting=setting, what=extension or repr(filename)
    )
    if check_available:
        missing = parser.missing() if hasattr(parser, "missing") else None
        if missing is not None:
            package, extra = missing
            name = f"{type(parser).__module__}.{type(parser).__qualname__}"
            raise ParserUnavailable(package, extra, parser=name, filename=filename)
    return parser


def fallback_parser() -> Parser | None:
    """``FALLBACK_PARSER`` built with its options (None when unset); a bad one raises
    ConfigurationError naming the setting."""
    spec = get_setting("FALLBACK_PARSER")
    if spec is None:
        return None
    spec, options = _spec_parts(spec, "FALLBACK_PARSER")
    return _build(spec, options, {}, setting="FALLBACK_PARSER", what="unclaimed extensions")


def parser_formats() -> dict[str, str]:
    """``{content type: "markdown" or "text"}``: what a stored document of each content type
    was chunked as. A document keeps its content type, not its format: its chunk headers are
    rebuilt with this (``rag_maintenance headers``). Text given to ``ingest`` comes first
    (``TEXT_CONTENT_TYPES``: plain text is text, Markdown and HTML are chunked as Markdown),
    then each registered parser's :attr:`Parser.format`, then the fallback's."""
    formats = {
        content_type: "text" if given == "text" else "markdown"
        for given, content_type in TEXT_CONTENT_TYPES.items()
    }
    parsers = [
        get_parser(f"x{extension}", check_available=False) for extension in parser_registry()
    ]
    fallback = fallback_parser()
    if fallback is not None:
        parsers.append(fallback)
    for parser in parsers:
        formats.setdefault(parser.content_type, getattr(parser, "format", "text"))
    return formats


def parse_bytes(
    data: bytes, *, filename: str, options: dict[str, Any] | None = None
) -> ParsedDocument:
    """Parse ``data`` with the parser registered for ``filename``'s extension. Every archive
    the parse opens, however deep (an email's attachments), inflates from one
    ``MAX_ZIP_UNCOMPRESSED_BYTES`` budget. ``options``: see :func:`get_parser`."""
    from .archives import inflation_budget

    parser = get_parser(filename, options=options)
    with inflation_budget():
        parsed = parser.parse(data, filename=filename)
    parsed = check_parsed(parsed, parser=parser, filename=filename)
    if not parsed.content_type or parsed.content_type == "application/octet-stream":
        parsed.content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    return parsed


def parse_file(path: str | Path, *, options: dict[str, Any] | None = None) -> ParsedDocument:
    """Parse the file at ``path``; only regular files are read, and never more than needed.
    ``options``: see :func:`get_parser`."""
    path = Path(path)
    parser = get_parser(
        path.name, options=options
    )  # unsupported types fail before the file is read
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
    return parse_bytes(data, filename=path.name, options=options)

"""Helpers the office, web and mail parsers share: building the text section by section
within the budgets, Markdown tables, and the checks a ZIP-based (OOXML) file passes before a
library opens it."""

from __future__ import annotations

import importlib
import importlib.metadata
import io
import re
import time
import zipfile
from typing import Any

from ...exceptions import BrokenDependency, CorruptFile, DocumentTooLarge, MissingDependency
from .base import Page, ParsedDocument, budget_setting, too_many_chars


def require(module: str, extra: str, what: str, *, distribution: str | None = None) -> Any:
    """Import ``module`` or raise :class:`MissingDependency` naming the extra that installs it.

    ``distribution`` is the name of the package that provides ``module`` (default: the module's
    top-level name). When that package is installed but the import fails all the same, the
    error is :class:`BrokenDependency`: it names the module whose import failed and the real
    ImportError, instead of calling an installed package "not installed"."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = distribution or module.split(".")[0]
        version = installed_version(package)
        if version is None:
            raise MissingDependency(package, extra, what) from exc
        raise BrokenDependency(
            package,
            extra,
            what,
            version=version,
            module=failed_module(exc, module),
            error=f"{type(exc).__name__}: {exc}"[:500],
        ) from exc


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata), or None when it is not."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def failed_module(exc: ImportError, module: str) -> str:
    """The module whose code raised ``exc``: the deepest frame of its traceback outside the
    import machinery (``require`` itself is the first frame); ``module`` when there is none (the
    import was refused before any of the package's code ran)."""
    name = None
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # skip require()'s own frame
    while tb is not None:
        frame_module = tb.tb_frame.f_globals.get("__name__", "")
        if frame_module and not frame_module.startswith(("importlib", "_frozen_importlib")):
            name = frame_module
        tb = tb.tb_next
    return name or module


class TextBuilder:
    """Collects a document's text part by part, with page (slide, sheet) spans, refusing it
    as soon as it passes ``MAX_DOCUMENT_CHARS`` or ``PARSE_TIMEOUT`` or has more pages than
    ``MAX_PDF_PAGES``: the budgets are counted on what extraction produces, while it runs."""

    def __init__(self, filename: str, *, what: str = "page"):
        self.filename = filename
        self.what = what
        self.started = time.monotonic()
        self.max_chars = budget_setting("MAX_DOCUMENT_CHARS")
        self.max_pages = budget_setting("MAX_PDF_PAGES")
        self.timeout = budget_setting("PARSE_TIMEOUT", integer=False)
        self.parts: list[str] = []
        self.length = 0
        self.pages: list[Page] = []
        self._page_start: int | None = None

    def check_time(self) -> None:
        if self.timeout is not None and time.monotonic() - self.started > self.timeout:
            raise DocumentTooLarge(
                f"{self.filename}: reading its text took more than PARSE_TIMEOUT "
                f"({self.timeout} s). Split the file, or raise DJANGO_RAG['PARSE_TIMEOUT'] "
                "(seconds).",
                filename=self.filename,
                setting="PARSE_TIMEOUT",
                limit=self.timeout,
            )

    def add(self, text: str, *, tight: bool = False) -> None:
        """Append a block (a paragraph, a heading, a table...), separated by a blank line from
        the previous one, or by a line break when ``tight`` (the next row of a table, the next
        item of a list)."""
        if not text:
            return
        if self.parts:
            joint = "\n" if tight else "\n\n"
            if self._page_start == self.length:
                joint = ""  # the first block of a page: the page break already separates
            self.parts.append(joint)
            self.length += len(joint)
        self.parts.append(text)
        self.length += len(text)
        if self.max_chars is not None and self.length > self.max_chars:
            raise too_many_chars(self.filename, self.length, self.max_chars)
        self.check_time()

    def start_page(self, number: int) -> None:
        """Begin page (slide, sheet) ``number``; the previous one ends where its text ends."""
        self.end_page()
        if self.max_pages is not None and number > self.max_pages:
            raise DocumentTooLarge(
                f"{self.filename} has more than MAX_PDF_PAGES ({self.max_pages:,}) "
                f"{self.what}s. Split it, or raise DJANGO_RAG['MAX_PDF_PAGES'] (it bounds "
                "pages, slides and sheets alike).",
                filename=self.filename,
                setting="MAX_PDF_PAGES",
                limit=self.max_pages,
            )
        if self.parts:
            self.parts.append("\n\n")
            self.length += 2
        self._page_start = self.length
        self.pages.append(Page(number=number, start=self.length, end=self.length))

    def end_page(self) -> None:
        if self.pages:
            self.pages[-1].end = self.length

    def result(self, **fields: Any) -> ParsedDocument:
        self.end_page()
        return ParsedDocument(text="".join(self.parts), pages=self.pages, **fields)


_PIPE = re.compile(r"(\\*)\|")


def cell_text(value: Any) -> str:
    """One table cell on one line: pipes escaped, line breaks as spaces, so a Markdown table
    row stays a single line however hostile the cell."""
    if value is None:
        return ""
    text = " ".join(str(value).split())
    if "|" in text:
        # GitHub-flavoured Markdown: "\|" is a pipe inside a cell; backslashes right before a
        # pipe are doubled so they stay backslashes (elsewhere a backslash is literal).
        text = _PIPE.sub(lambda match: match.group(1) * 2 + "\\|", text)
    return text


def table_row(cells: list[Any]) -> str:
    return "| " + " | ".join(cell_text(cell) for cell in cells) + " |"


def header_rule(width: int) -> str:
    return "|" + "---|" * max(width, 1)


def markdown_table(rows: list[list[Any]]) -> str:
    """Rows (the first is the header) as a GitHub-flavoured Markdown table; short rows are
    padded so every row has the header's width."""
    rows = [row for row in rows if any(cell_text(cell) for cell in row)]
    if not rows:
        return ""
    width = max(len(row) for row in rows)
    padded = [list(row) + [""] * (width - len(row)) for row in rows]
    lines = [table_row(padded[0]), header_rule(width)]
    lines.extend(table_row(row) for row in padded[1:])
    return "\n".join(lines)


_DOCTYPE_MARKS = (b"<!DOCTYPE", "<!DOCTYPE".encode("utf-16-le"), "<!DOCTYPE".encode("utf-16-be"))


def check_ooxml(data: bytes, *, filename: str, required: str) -> io.BytesIO:
    """Verify an Office Open XML file (DOCX, PPTX, XLSX) before its library reads it, and
    return what the library must read instead of ``data``: the archive re-packed by
    :func:`~django_rag.ingestion.archives.verified_zip` (every member inflated once within the
    ZIP budgets, counted as it inflates, and stored, so the library's own zipfile inflates
    nothing), once it holds the part the format needs and no XML part declaring a DTD. OOXML
    parts never carry one; a DTD is how entity-expansion bombs ("billion laughs") and
    external entities get in, so refusing it makes the XML parsers' own settings moot."""
    from .archives import read_member, verified_zip

    verified = verified_zip(data, filename=filename)
    with zipfile.ZipFile(io.BytesIO(verified)) as archive:
        names = set()
        for member in archive.infolist():
            names.add(member.filename)
            if not member.filename.endswith((".xml", ".rels", ".vml")):
                continue
            content = read_member(archive, member.filename, filename=filename)
            if any(mark in content for mark in _DOCTYPE_MARKS):
                raise CorruptFile(
                    f"{filename}: its part {member.filename[:200]!r} declares a DTD, which "
                    "Office files never do (it is how XML entity-expansion bombs work), so the "
                    "file was not read. Re-save it from an office suite.",
                    filename=filename,
                    member=member.filename[:200],
                )
        if required not in names:
            raise CorruptFile(
                f"{filename} lacks {required}: it is not a valid file of its type (or has the "
                "wrong extension). Re-save it from an office suite.",
                filename=filename,
            )
    return io.BytesIO(verified)

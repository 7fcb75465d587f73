"""PDF: the text layer read with pymupdf, page by page, within budgets."""

from __future__ import annotations

import bisect
import time

from ...conf import get_setting
from ...exceptions import (
    CorruptFile,
    DocumentTooLarge,
    EncryptedPDF,
)
from ..ocr import ScannedPages
from ..pdftext import (
    MAX_LAYOUT_CHARS,
    blocks_from_dict,
    hyphenated_words,
    page_text,
    reading_order,
    restore_hyphens,
)
from ..titles import pdf_title
from .base import Page, ParsedDocument, Parser, budget_setting, too_many_chars
from .common import require
from .pdfcost import PageCost
from .pdftables import TABLE_MAX_PAGE_BYTES, find_tables, text_with_tables


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

    requires = (("pymupdf", "pdf", "pymupdf"),)

    content_type = "application/pdf"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        pymupdf = require("pymupdf", "pdf", "Reading PDF files")
        started = time.monotonic()
        max_chars = budget_setting("MAX_DOCUMENT_CHARS")
        max_pages = budget_setting("MAX_PDF_PAGES")
        max_page_bytes = budget_setting("MAX_PDF_PAGE_CONTENT_BYTES")
        timeout = budget_setting("PARSE_TIMEOUT", integer=False)
        detect_tables = bool(get_setting("PDF_TABLES"))
        # The table finder costs ~9 times the text extraction: it may use half the time
        # budget, then the remaining pages are read as prose (and the metadata says from where).
        table_seconds = None if timeout is None else timeout / 2
        table_time = 0.0
        tables_found = 0
        tables_stopped_at: int | None = None
        pages_too_busy = 0
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
            page_cost = PageCost(document, max_page_bytes) if max_page_bytes else None
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
                    tables = []
                    if detect_tables and tables_stopped_at is None:
                        if table_seconds is not None and table_time > table_seconds:
                            tables_stopped_at = number
                        elif _table_cost(page, cost if page_cost else None, document) > (
                            TABLE_MAX_PAGE_BYTES
                        ):
                            pages_too_busy += 1  # read as prose: see TABLE_MAX_PAGE_BYTES
                        else:
                            began = time.monotonic()
                            tables = find_tables(page)
                            table_time += time.monotonic() - began
                    tables_found += len(tables)
                    cleaned = text_with_tables(blocks, tables) if tables else page_text(blocks)
                    text = cleaned.text
                    joins.extend((offset + at, key) for at, key in cleaned.joins)
                del textpage, plain, layout
                if not text:  # a scanned page: read by OCR, or recorded as not read
                    text = scans.read(page, number)
                pages.append(Page(number=number, start=offset, end=offset + len(text)))
                parts.append(text)
                offset += len(text)
                if max_chars is not None and offset > max_chars:
                    error = too_many_chars(
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
            metadata: dict = {"page_count": page_count, **scans.metadata()}
            if tables_found:
                metadata["tables"] = tables_found
            if pages_too_busy:
                metadata["tables_not_searched_on_pages"] = pages_too_busy
            if tables_stopped_at is not None:
                metadata["tables_not_searched_from_page"] = tables_stopped_at
            title = (document.metadata or {}).get("title") or ""
            return ParsedDocument(
                text=text,
                content_type=self.content_type,
                # Markdown when it holds tables, so the chunker keeps their rows whole.
                format="markdown" if tables_found else "text",
                # A file name or a tool's placeholder in the metadata loses to the heading.
                title=pdf_title(title if isinstance(title, str) else "", first_page, text),
                pages=pages,
                metadata=metadata,
            )


def _table_cost(page, cost: int | None, document) -> int:
    """The page's drawing cost (measured already when MAX_PDF_PAGE_CONTENT_BYTES is set)."""
    if cost is not None:
        return cost
    try:
        return PageCost(document, TABLE_MAX_PAGE_BYTES)(page)
    except Exception:
        return TABLE_MAX_PAGE_BYTES + 1  # unmeasurable: no table search

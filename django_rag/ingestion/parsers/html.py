"""HTML: a page's main content as Markdown, read with trafilatura (the ``html`` extra).

trafilatura finds the main content of a page (dropping navigation, headers, footers, sidebars,
cookie banners, scripts and styles) and writes it as Markdown: headings as ``#`` lines, lists,
tables as Markdown tables, emphasis; a link keeps its text (its address is dropped, as it adds
nothing a search could match). It is parsed by lxml, whose HTML parser does not expand
entities from a DTD and stops at a bounded depth.
"""

from __future__ import annotations

from typing import Any

from ...exceptions import DocumentTooLarge, EmptyDocument
from .base import ParsedDocument, Parser, _limit, _too_many_chars, check_input_size
from .common import require

_OPTIONS = {
    "output_format": "markdown",
    "include_tables": True,
    "include_formatting": True,
    "include_links": False,  # the text of a link is kept, its target dropped
    "include_images": False,
    "include_comments": False,
    "deduplicate": False,
}
# Metadata trafilatura reads from the page (meta tags, JSON-LD) that is kept on the document.
# Not the date: without a date in the page's metadata it is guessed (a copyright line's year).
_METADATA = ("author", "sitename", "description", "url")


def _extract(trafilatura: Any, html: str | bytes, *, favor_recall: bool) -> str:
    text = trafilatura.extract(html, favor_recall=favor_recall, **_OPTIONS) or ""
    # Table rows come with a trailing space; trailing whitespace carries nothing.
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def html_to_markdown(html: str, *, main_content: bool = False) -> str:
    """Markdown for an HTML string: headings, lists, tables, emphasis and link text kept,
    scripts and styles dropped. With ``main_content=False`` (rich-text fields, fragments)
    everything readable is kept; with ``True`` (whole pages) navigation, headers and footers
    are dropped too. Returns "" when nothing readable is left.

    ``@rag.indexed(format="html")`` and ``rag.ingest(html, format="html")`` use it."""
    trafilatura = require("trafilatura", "html", "Reading HTML")
    if not html or not html.strip():
        return ""
    limit = _limit("MAX_DOCUMENT_CHARS")
    if limit is not None and len(html) > 4 * limit:
        raise DocumentTooLarge(
            f"The HTML has {len(html):,} characters, more than 4 x MAX_DOCUMENT_CHARS "
            f"({4 * limit:,}) of markup. Split it, or raise DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
            setting="MAX_DOCUMENT_CHARS",
            length=len(html),
            limit=4 * limit,
        )
    if not main_content:
        # A fragment wrapped as an article is read as content in full (headings included).
        html = f"<html><body><article>{html}</article></body></html>"
    text = _extract(trafilatura, html, favor_recall=not main_content)
    if not text and main_content:
        text = _extract(trafilatura, html, favor_recall=True)
    return text


class HtmlParser(Parser):
    """A saved web page or an HTML export: the main content as Markdown, the page's title
    (``<title>``, Open Graph or the first heading) as the title, author/date/site name/
    description as metadata."""

    content_type = "text/html"
    format = "markdown"

    def max_input_bytes(self) -> int | None:
        limit = _limit("MAX_DOCUMENT_CHARS")
        return None if limit is None else 4 * limit + 4

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        trafilatura = require("trafilatura", "html", "Reading HTML")
        check_input_size(self, len(data), filename=filename)
        # Bytes go in as they are: trafilatura reads the page's declared charset (and guesses
        # one for pages that declare none), so a Latin-1 page is not refused as invalid UTF-8.
        # A page whose main content is short is read again favouring recall.
        text = _extract(trafilatura, data, favor_recall=False) or _extract(
            trafilatura, data, favor_recall=True
        )
        if not text:
            raise EmptyDocument(
                f"{filename} has no readable text: no main content was found in its HTML (it "
                "may be empty, only navigation, built by JavaScript, or not HTML at all). Save "
                "the page after it has rendered, or ingest its text.",
                filename=filename,
            )
        max_chars = _limit("MAX_DOCUMENT_CHARS")
        if max_chars is not None and len(text) > max_chars:
            raise _too_many_chars(filename, len(text), max_chars)
        found = require("trafilatura.metadata", "html", "Reading HTML").extract_metadata(data)
        metadata = {
            key: str(getattr(found, key))[:1000] for key in _METADATA if getattr(found, key, None)
        }
        return ParsedDocument(
            text=text,
            format=self.format,
            content_type=self.content_type,
            title=str(getattr(found, "title", "") or "")[:500],
            metadata=metadata,
        )

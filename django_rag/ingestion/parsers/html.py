"""HTML: a page's main content as Markdown, read with trafilatura (the ``html`` extra).

trafilatura finds the main content of a page (dropping navigation, headers, footers, sidebars,
cookie banners, scripts and styles) and writes it as Markdown: headings as ``#`` lines, lists,
tables as Markdown tables, emphasis; a link keeps its text (its address is dropped, as it adds
nothing a search could match). It is parsed by lxml, whose HTML parser does not expand
entities from a DTD and stops at a bounded depth.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ...exceptions import DocumentTooLarge, EmptyDocument
from .base import ParsedDocument, Parser, budget_setting, check_input_size, too_many_chars
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

#: Attributes one tag keeps (the rest are dropped before lxml sees the page). libxml2 checks
#: every attribute of a tag against the ones before it: one element with 100,000 attributes
#: took 20 s to parse, and trafilatura parses a page several times. No text is lost: no
#: attribute holds text that trafilatura keeps.
MAX_HTML_ATTRIBUTES = 100
#: Elements past which a page is read in one pass: trafilatura's precision pass only (no
#: comparison with its fallback extractors, no second pass favouring recall), and the metadata
#: from the ``<head>``. Each pass costs about 30 microseconds and a few hundred bytes an element.
ONE_PASS_ELEMENTS = 50_000
#: Elements past which a page is refused (DocumentTooLarge): 500,000 unclosed ``<a>`` (1.5 MB)
#: took 33 s and 1.3 GB in trafilatura.
MAX_HTML_ELEMENTS = 200_000


def _extract(trafilatura: Any, tree: Any, *, favor_recall: bool, fast: bool = False) -> str:
    # trafilatura copies the tree it is given, so one parsed tree serves every pass.
    text = trafilatura.extract(tree, favor_recall=favor_recall, fast=fast, **_OPTIONS) or ""
    # Table rows come with a trailing space; trailing whitespace carries nothing.
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def check_markup_size(html: str) -> None:
    """Refuse HTML text longer than 4 x ``MAX_DOCUMENT_CHARS`` (cheap: run before a worker is
    asked to convert it)."""
    limit = budget_setting("MAX_DOCUMENT_CHARS")
    if limit is not None and len(html) > 4 * limit:
        raise DocumentTooLarge(
            f"The HTML has {len(html):,} characters, more than 4 x MAX_DOCUMENT_CHARS "
            f"({4 * limit:,}) of markup. Split it, or raise DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
            setting="MAX_DOCUMENT_CHARS",
            length=len(html),
            limit=4 * limit,
        )


class _Clock:
    """``PARSE_TIMEOUT`` for one page, checked between trafilatura's passes."""

    def __init__(self, label: str):
        self.label = label
        self.started = time.monotonic()
        self.timeout = budget_setting("PARSE_TIMEOUT", integer=False)

    def left(self) -> float | None:
        if self.timeout is None:
            return None
        return self.timeout - (time.monotonic() - self.started)

    def check(self, *, needed: float = 0.0) -> None:
        """Raise once the budget is spent, or when less is left than ``needed`` (what the
        pass about to start took last time)."""
        left = self.left()
        if left is not None and left < needed:
            raise DocumentTooLarge(
                f"{self.label}: reading its text took more than PARSE_TIMEOUT "
                f"({self.timeout} s). Split the page, or raise DJANGO_RAG['PARSE_TIMEOUT'] "
                "(seconds).",
                filename=self.label,
                setting="PARSE_TIMEOUT",
                limit=self.timeout,
            )


def _load(markup: str | bytes, *, label: str, clock: _Clock) -> tuple[Any, int]:
    """The page parsed once (lxml, as trafilatura parses it) and its element count; (None, 0)
    when it is not HTML. Tags with more than ``MAX_HTML_ATTRIBUTES`` attributes are cut
    before lxml reads them; a page of more than ``MAX_HTML_ELEMENTS`` elements is refused."""
    require("trafilatura", "html", "Reading HTML")
    from trafilatura.utils import decode_file, load_html, repair_faulty_html

    # Bytes go in as they are: trafilatura reads the page's declared charset (and guesses one
    # for pages that declare none), so a Latin-1 page is not refused as invalid UTF-8.
    text = decode_file(markup) if isinstance(markup, bytes) else markup
    # Repaired first (trafilatura drops characters XML forbids), so the attribute scan reads
    # exactly what lxml will.
    text = limit_attributes(repair_faulty_html(text, text[:50].lower()))
    tree = load_html(text)
    del text
    clock.check()
    if tree is None:
        return None, 0
    count = 0
    for count, _ in enumerate(tree.iter(), 1):  # noqa: B007 - the count is what is wanted
        if count > MAX_HTML_ELEMENTS:
            raise DocumentTooLarge(
                f"{label} has more than {MAX_HTML_ELEMENTS:,} HTML elements: reading a page "
                "that large costs more time and memory than one document may take. Split "
                "it into several pages and ingest those.",
                filename=label,
                setting=None,
                limit=MAX_HTML_ELEMENTS,
            )
    return tree, count


def _text(tree: Any, elements: int, *, recall_first: bool, clock: _Clock) -> str:
    """Markdown of the page's content: one pass favouring precision (or recall, with
    ``recall_first``), then one favouring recall when the first found nothing; one pass
    only for a page of more than ``ONE_PASS_ELEMENTS`` elements."""
    trafilatura = require("trafilatura", "html", "Reading HTML")
    one_pass = elements > ONE_PASS_ELEMENTS
    begun = time.monotonic()
    text = _extract(trafilatura, tree, favor_recall=recall_first or one_pass, fast=one_pass)
    took = time.monotonic() - begun
    clock.check()
    if not text and not recall_first and not one_pass:
        clock.check(needed=took)  # the second pass costs about what the first did
        text = _extract(trafilatura, tree, favor_recall=True)
        clock.check()
    return text


def html_to_markdown(html: str, *, main_content: bool = False) -> str:
    """Markdown for an HTML string: headings, lists, tables, emphasis and link text kept,
    scripts and styles dropped. With ``main_content=False`` (rich-text fields, fragments)
    everything readable is kept; with ``True`` (whole pages) navigation, headers and footers
    are dropped too. Returns "" when nothing readable is left.

    It runs in the calling process: ``@rag.indexed(format="html")`` and
    ``rag.ingest(html, format="html")`` call it in a bounded worker
    (:func:`~django_rag.ingestion.isolation.html_to_markdown_isolated`)."""
    require("trafilatura", "html", "Reading HTML")
    if not html or not html.strip():
        return ""
    check_markup_size(html)
    if not main_content:
        # A fragment wrapped as an article is read as content in full (headings included).
        html = f"<html><body><article>{html}</article></body></html>"
    clock = _Clock("The HTML")
    tree, elements = _load(html, label="The HTML", clock=clock)
    del html
    if tree is None:
        return ""
    return _text(tree, elements, recall_first=not main_content, clock=clock)


# --- cutting tags with too many attributes, as the HTML5 tokenizer reads them ------------------
#
# libxml2 (2.14, in lxml 6) tokenizes HTML as HTML5 does, so this scan follows the same states
# where they decide what is a tag: comments (closed by "-->", "--!>", or at once by "<!-->" and
# "<!--->"), other "<!" and "<?" markup up to the first ">", end tags (which carry attributes
# too), raw text (script, style, xmp, iframe, noembed, noframes: up to their end tag; script
# with its escaped states), RCDATA (title, textarea), plaintext (to the end), and inside a tag
# the attribute states (a quoted value may hold ">"; a quoted value needs no space after it).
# Where a scan could disagree with the parser, the worker's budgets still bound the parse.

_SPACE = "\t\n\f\r "
_ATTRIBUTE = (
    f"[^{_SPACE}/>][^{_SPACE}/>=]*"  # a name (its first character may be "=")
    f"(?:[{_SPACE}]*=[{_SPACE}]*"  # "=", then a value (none before ">")
    f"(?:\"[^\"]*\"|'[^']*'|[^{_SPACE}>\"'][^{_SPACE}>]*)?)?"
)
_TAG = re.compile(
    f"<(/?)([A-Za-z][^{_SPACE}/>]*)((?:[{_SPACE}/]*{_ATTRIBUTE})*)[{_SPACE}/]*(>|\\Z)"
)
_ATTRIBUTES = re.compile(f"[{_SPACE}/]*{_ATTRIBUTE}")
_COMMENT_END = re.compile("--!?>")
_RAW_TEXT = ("style", "xmp", "iframe", "noembed", "noframes", "title", "textarea")
_SCRIPT = re.compile(f"<!--(-*>)?|-{{2,}}>|</?script(?=[{_SPACE}/>])", re.IGNORECASE)


def limit_attributes(markup: str, limit: int = MAX_HTML_ATTRIBUTES) -> str:
    """``markup`` with every tag cut to its first ``limit`` attributes (the same string when
    no tag has more). Linear in the length: one scan, one regular-expression match per tag."""
    if len(markup) < 2 * limit:  # each attribute takes two characters at least
        return markup
    pieces: list[str] = []
    copied = at = 0
    end = len(markup)
    while True:
        lt = markup.find("<", at)
        if lt < 0 or lt + 1 >= end:
            break
        after = markup[lt + 1]
        if markup.startswith("<!--", lt):
            if markup.startswith(">", lt + 4) or markup.startswith("->", lt + 4):
                at = lt + 5
                continue
            found = _COMMENT_END.search(markup, lt + 4)
            if found is None:
                break  # a comment to the end of the page
            at = found.end()
            continue
        if after in "!?" or (after == "/" and not _alpha(markup, lt + 2)):
            if markup.startswith("</>", lt):
                at = lt + 3
                continue
            close = markup.find(">", lt + 2)
            if close < 0:
                break
            at = close + 1
            continue
        if not _alpha(markup, lt + 1) and after != "/":
            at = lt + 1
            continue
        tag = _TAG.match(markup, lt)
        if tag is None:  # pragma: no cover - the pattern matches any tag up to ">" or the end
            at = lt + 1
            continue
        if tag.end() - lt > 2 * limit:
            kept = _first_attributes(tag.group(3), limit)
            if kept is not None:
                pieces += [markup[copied:lt], f"<{tag.group(1)}{tag.group(2)}{kept}>"]
                copied = tag.end()
        if not tag.group(4):
            break  # a tag the page ends inside is dropped by the parser, with the rest
        at = tag.end()
        if tag.group(1):
            continue
        name = tag.group(2).lower()
        if name == "plaintext":
            break
        if name == "script":
            at = _script_end(markup, at)
        elif name in _RAW_TEXT:
            closing = re.compile(f"</{name}(?=[{_SPACE}/>])", re.IGNORECASE).search(markup, at)
            at = end if closing is None else closing.start()
        if at >= end:
            break
    if not pieces:
        return markup
    pieces.append(markup[copied:])
    return "".join(pieces)


def _alpha(markup: str, index: int) -> bool:
    return index < len(markup) and markup[index].isascii() and markup[index].isalpha()


def _first_attributes(attributes: str, limit: int) -> str | None:
    """The text of the first ``limit`` attributes, or None when there are no more."""
    count, stop = 0, 0
    for match in _ATTRIBUTES.finditer(attributes):
        if count == limit:
            return attributes[:stop]
        count, stop = count + 1, match.end()
    return None


def _script_end(markup: str, at: int) -> int:
    """Where a script's end tag starts (the end of the page when it has none), through the
    HTML5 script states: "<!--" escapes, "<script" inside an escape nests, "-->" ends both."""
    state = "data"
    for token in _SCRIPT.finditer(markup, at):
        text = token.group(0).lower()
        if text.startswith("<!--"):
            if token.group(1):  # "<!-->": opened and closed at once
                state = "data"
            elif state == "data":
                state = "escaped"
        elif text.startswith("-"):
            if state != "data":
                state = "data"
        elif text == "</script":
            if state == "double":
                state = "escaped"
            else:
                return token.start()
        elif state == "escaped":  # "<script"
            state = "double"
    return len(markup)


class HtmlParser(Parser):
    """A saved web page or an HTML export: the main content as Markdown, the page's title
    (``<title>``, Open Graph or the first heading) as the title, author/date/site name/
    description as metadata."""

    requires = (("trafilatura", "html", "trafilatura"),)

    content_type = "text/html"
    format = "markdown"

    def max_input_bytes(self) -> int | None:
        limit = budget_setting("MAX_DOCUMENT_CHARS")
        return None if limit is None else 4 * limit + 4

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        require("trafilatura", "html", "Reading HTML")
        check_input_size(self, len(data), filename=filename)
        clock = _Clock(filename)
        tree, elements = _load(data, label=filename, clock=clock)
        del data
        # A page whose main content is short is read again favouring recall.
        text = _text(tree, elements, recall_first=False, clock=clock) if tree is not None else ""
        if not text:
            raise EmptyDocument(
                f"{filename} has no readable text: no main content was found in its HTML (it "
                "may be empty, only navigation, built by JavaScript, or not HTML at all). Save "
                "the page after it has rendered, or ingest its text.",
                filename=filename,
            )
        max_chars = budget_setting("MAX_DOCUMENT_CHARS")
        if max_chars is not None and len(text) > max_chars:
            raise too_many_chars(filename, len(text), max_chars)
        if elements > ONE_PASS_ELEMENTS:
            # A large page's metadata is read from its <head> (meta tags, JSON-LD, title).
            for body in tree.findall("body"):
                tree.remove(body)
        found = require("trafilatura.metadata", "html", "Reading HTML").extract_metadata(tree)
        clock.check()
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

"""DOCX (Word): paragraphs, headings, lists and tables as Markdown, read with python-docx (the
``docx`` extra)."""

from __future__ import annotations

import re
from typing import Any

from ...exceptions import CorruptFile, RagError
from .base import ParsedDocument, Parser
from .common import TextBuilder, check_ooxml, markdown_table, require

_HEADING = re.compile(r"heading (\d)$", re.IGNORECASE)
_WORD_NS = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def heading_level(style_name: str) -> int:
    """1-6 for Word's "Title" and "Heading N" styles (deeper headings count as 6), else 0."""
    name = (style_name or "").strip()
    if name.lower() == "title":
        return 1
    match = _HEADING.match(name)
    return min(int(match.group(1)), 6) if match else 0


def _list_level(paragraph: Any, style: str) -> int | None:
    """The nesting level (0-based) of a list item, None for an ordinary paragraph."""
    p_pr = paragraph._p.pPr
    num_pr = p_pr.numPr if p_pr is not None else None
    if num_pr is not None and num_pr.numId is not None and num_pr.numId.val:
        ilvl = num_pr.ilvl
        return min(int(ilvl.val) if ilvl is not None else 0, 8)
    if style.lower().startswith("list"):
        digits = re.search(r"(\d)$", style)
        return int(digits.group(1)) - 1 if digits else 0
    return None


def style_names(document: Any) -> dict[str, str]:
    """Style id -> name, read once: python-docx's ``paragraph.style`` scans every style of the
    document for each paragraph (10 ms a paragraph on a 1,000-paragraph file)."""
    return {style.style_id: style.name or "" for style in document.styles}


def paragraph_markdown(paragraph: Any, style: str) -> str:
    text = " ".join((paragraph.text or "").split())
    if not text:
        return ""
    level = heading_level(style)
    if level:
        return f"{'#' * level} {text}"
    depth = _list_level(paragraph, style)
    if depth is not None:
        marker = "1." if "number" in (style or "").lower() else "-"
        return f"{'  ' * depth}{marker} {text}"
    return text


def table_markdown(table: Any) -> str:
    """A Word table as a Markdown table, its first row the header. A merged cell repeats its
    text in each column it spans, so rows keep the header's columns."""
    rows = [[cell.text for cell in row.cells] for row in table.rows]
    return markdown_table(rows)


class DocxParser(Parser):
    """A Word document in reading order: headings (``Title``, ``Heading 1``-``6``) as Markdown
    headings, list items as ``-``/``1.`` items indented by level, tables as Markdown tables.
    Headers and footers (page numbers, running titles) are left out unless
    ``include_headers_footers=True``; comments, tracked deletions, images and text boxes are
    left out. The core properties' title (else the first heading) is the title; the author and
    dates are metadata."""

    requires = (("docx", "docx", "python-docx"),)

    content_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    format = "markdown"

    def __init__(self, *, include_headers_footers: bool = False):
        self.include_headers_footers = include_headers_footers

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        docx = require("docx", "docx", "Reading Word (.docx) files", distribution="python-docx")
        verified = check_ooxml(data, filename=filename, required="word/document.xml")
        try:
            document = docx.Document(verified)
        except Exception as exc:  # lxml, zipfile, KeyError for missing parts
            raise CorruptFile(
                f"{filename} could not be read as a Word document ({exc}); it may be damaged "
                "or saved in another format (.doc files must be converted to .docx first).",
                filename=filename,
            ) from exc
        builder = TextBuilder(filename)
        first_heading = ""
        try:
            if self.include_headers_footers:
                for text in self._headers(document):
                    builder.add(text)
            in_list = False
            names = style_names(document)
            for block in document.iter_inner_content():
                if block.__class__.__name__ == "Table":
                    builder.add(table_markdown(block))
                    in_list = False
                    continue
                style = names.get(block._p.style or "", "")
                text = paragraph_markdown(block, style)
                if not text:
                    continue
                if text.startswith("#") and not first_heading:
                    first_heading = text.lstrip("#").strip()
                item = _list_level(block, style) is not None and not text.startswith("#")
                builder.add(text, tight=item and in_list)
                in_list = item
            if self.include_headers_footers:
                for text in self._headers(document, footers=True):
                    builder.add(text)
        except RagError:
            raise  # a budget exceeded
        except Exception as exc:
            raise CorruptFile(
                f"{filename} is damaged: reading its body failed ({exc}).", filename=filename
            ) from exc
        properties = document.core_properties
        metadata = {}
        if properties.author:
            metadata["author"] = str(properties.author)[:500]
        for key in ("created", "modified"):
            value = getattr(properties, key, None)
            if value is not None:
                metadata[key] = value.isoformat()
        return builder.result(
            format=self.format,
            content_type=self.content_type,
            title=(str(properties.title or "").strip() or first_heading)[:500],
            metadata=metadata,
        )

    @staticmethod
    def _headers(document: Any, *, footers: bool = False) -> list[str]:
        seen: list[str] = []
        for section in document.sections:
            part = section.footer if footers else section.header
            for paragraph in part.paragraphs:
                text = " ".join((paragraph.text or "").split())
                if text and text not in seen:  # each section repeats the same header
                    seen.append(text)
        return seen

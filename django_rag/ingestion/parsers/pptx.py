"""PPTX (PowerPoint): one slide per page, read with python-pptx (the ``pptx`` extra)."""

from __future__ import annotations

from typing import Any

from ...exceptions import CorruptFile, RagError
from .base import ParsedDocument, Parser
from .common import TextBuilder, check_ooxml, markdown_table, require

# Groups inside groups are read this deep; deeper shapes are skipped (a hostile deck can nest
# them without end, and no real one needs more).
MAX_GROUP_DEPTH = 16
# Placeholders that repeat on every slide and carry no content.
_SKIPPED_PLACEHOLDERS = {"FOOTER", "SLIDE_NUMBER", "DATE"}


def _placeholder_kind(shape: Any) -> str:
    if not getattr(shape, "is_placeholder", False):
        return ""
    try:
        return getattr(shape.placeholder_format.type, "name", "") or ""
    except (AttributeError, ValueError):
        return ""


def _reading_order(shapes: Any) -> list[Any]:
    """Shapes top to bottom, then left to right (a deck stores them in drawing order)."""
    return sorted(shapes, key=lambda shape: (shape.top or 0, shape.left or 0))


def text_frame_markdown(frame: Any, *, bullets: bool = False) -> str:
    """A text box's paragraphs, one a line. In a bulleted body (a content placeholder holding
    several paragraphs) each is a list item indented by its outline level; elsewhere only
    indented paragraphs are."""
    paragraphs = []
    for paragraph in frame.paragraphs:
        text = " ".join("".join(run.text for run in paragraph.runs).split())
        if text:
            paragraphs.append((min(paragraph.level or 0, 8), text))
    bullets = bullets and len(paragraphs) > 1
    lines = []
    for level, text in paragraphs:
        if bullets:
            lines.append(f"{'  ' * level}- {text}")
        else:
            lines.append(f"{'  ' * (level - 1)}- {text}" if level else text)
    return "\n".join(lines)


class PptxParser(Parser):
    """A PowerPoint deck: each slide is a page (so a chunk's page range is its slides), holding
    the slide's title as a ``## `` heading, then its text boxes, lists and tables in reading
    order (top to bottom, left to right, groups included), then its speaker notes under
    ``Notes:`` (``include_notes=False`` leaves them out). Footers, slide numbers, dates,
    images and charts are left out. The core properties' title (else the first slide's title)
    is the deck's title."""

    requires = (("pptx", "pptx", "python-pptx"),)

    content_type = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    format = "markdown"

    def __init__(self, *, include_notes: bool = True):
        self.include_notes = include_notes

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        pptx = require(
            "pptx", "pptx", "Reading PowerPoint (.pptx) files", distribution="python-pptx"
        )
        verified = check_ooxml(data, filename=filename, required="ppt/presentation.xml")
        try:
            deck = pptx.Presentation(verified)
        except Exception as exc:
            raise CorruptFile(
                f"{filename} could not be read as a PowerPoint deck ({exc}); it may be damaged "
                "or saved in another format (.ppt files must be converted to .pptx first).",
                filename=filename,
            ) from exc
        builder = TextBuilder(filename, what="slide")
        first_title = ""
        try:
            for number, slide in enumerate(deck.slides, start=1):
                builder.start_page(number)
                title_shape = slide.shapes.title
                title = " ".join((title_shape.text_frame.text if title_shape else "").split())
                if title:
                    builder.add(f"## {title}")
                    first_title = first_title or title
                for shape in _reading_order(slide.shapes):
                    if title_shape is not None and shape.shape_id == title_shape.shape_id:
                        continue
                    self._add_shape(builder, shape, 0)
                if self.include_notes and slide.has_notes_slide:
                    notes = slide.notes_slide.notes_text_frame
                    text = text_frame_markdown(notes) if notes is not None else ""
                    if text:
                        builder.add(f"Notes: {text}")
        except RagError:
            raise
        except Exception as exc:
            raise CorruptFile(
                f"{filename} is damaged: reading its slides failed ({exc}).", filename=filename
            ) from exc
        properties = deck.core_properties
        metadata: dict[str, Any] = {"slide_count": len(builder.pages)}
        if properties.author:
            metadata["author"] = str(properties.author)[:500]
        return builder.result(
            format=self.format,
            content_type=self.content_type,
            title=(str(properties.title or "").strip() or first_title)[:500],
            metadata=metadata,
        )

    def _add_shape(self, builder: TextBuilder, shape: Any, depth: int) -> None:
        from pptx.shapes.group import GroupShape

        if _placeholder_kind(shape) in _SKIPPED_PLACEHOLDERS:
            return
        # isinstance, not shape.shape_type: that raises for shapes of an unknown kind.
        if isinstance(shape, GroupShape):
            if depth < MAX_GROUP_DEPTH:
                for child in _reading_order(shape.shapes):
                    self._add_shape(builder, child, depth + 1)
            return
        if getattr(shape, "has_table", False):
            rows = [[cell.text for cell in row.cells] for row in shape.table.rows]
            builder.add(markdown_table(rows))
        elif getattr(shape, "has_text_frame", False):
            bullets = _placeholder_kind(shape) in ("BODY", "OBJECT")
            builder.add(text_frame_markdown(shape.text_frame, bullets=bullets))

"""Tables on a PDF page, found by pymupdf's table finder, written as Markdown tables in the
page's text where their cells were."""

from __future__ import annotations

from typing import Any

from ..pdftext import Block, Line, PageText, page_text
from .common import markdown_table

# A "table" with fewer filled cells than this share is a drawing's grid (a figure, a form's
# boxes, a diagram), not data: its text stays prose.
MIN_FILLED_SHARE = 0.5
# Pages drawing more than this (bytes of content, as MAX_PDF_PAGE_CONTENT_BYTES counts them)
# are not searched for tables: the finder builds a Python object per path segment, so 4 MB of
# line drawings cost 8 s of CPU and 560 MB (measured, under load on a shared 2-core machine).
# Below this a page costs at most about 2 s and 150 MB; its text is still read, as prose.
TABLE_MAX_PAGE_BYTES = 1024 * 1024
# The finder (its "lines" strategy) builds cells from drawn lines and rectangles: a page with
# fewer than this many has no ruled 2 x 2 table (a frame and one line each way is the least),
# so it is not searched. Counting them costs a fraction of a search.
MIN_RULES = 3


def has_rules(page: Any) -> bool:
    """Whether the page draws at least :data:`MIN_RULES` lines, rectangles or quads."""
    try:
        paths = page.get_cdrawings()
    except Exception:
        return True  # unknown: let the finder decide
    count = 0
    for path in paths:
        for item in path.get("items", ()):
            if item and item[0] in ("l", "re", "qu"):
                count += 1
                if count >= MIN_RULES:
                    return True
    return False


def find_tables(page: Any) -> list[tuple[tuple[float, float, float, float], str]]:
    """The page's tables as (bounding box, Markdown), in the finder's order. Tables of one
    row or one column, and grids mostly empty, are left out. A finder error finds none: the
    page's text is still read as prose."""
    import pymupdf

    # pymupdf prints an advertisement for another package on its first table search: it would
    # land in the output of rag_ingest and of the host's own commands.
    quiet = getattr(pymupdf, "no_recommend_layout", None)
    if quiet is not None:
        quiet()
    if not has_rules(page):
        return []
    try:
        found = page.find_tables()
    except Exception:
        return []
    tables = []
    for table in found.tables:
        try:
            rows = table.extract()
        except Exception:
            continue
        cells = [cell for row in rows for cell in row]
        filled = sum(1 for cell in cells if cell is not None and str(cell).strip())
        if len(rows) < 2 or table.col_count < 2 or filled < MIN_FILLED_SHARE * len(cells):
            continue
        text = markdown_table(rows)
        if text:
            tables.append((tuple(table.bbox), text))
    return tables


def _inside(line: Line, box: tuple[float, float, float, float]) -> bool:
    x = (line.x0 + line.x1) / 2
    y = (line.y0 + line.y1) / 2
    return box[0] - 1 <= x <= box[2] + 1 and box[1] - 1 <= y <= box[3] + 1


def text_with_tables(
    blocks: list[Block], tables: list[tuple[tuple[float, float, float, float], str]]
) -> PageText:
    """The page's text (as :func:`~django_rag.ingestion.pdftext.page_text` writes it) with each
    table's lines replaced by its Markdown, where the table's first line was in reading order.
    Lines outside every table are cleaned as prose, run by run."""
    pieces: list[PageText] = []
    run: list[Line] = []
    runs: list[Block] = []
    written: set[int] = set()

    def flush() -> None:
        if run:
            runs.append(Block(list(run)))
            run.clear()
        if runs:
            pieces.append(page_text(list(runs)))
            runs.clear()

    for block in blocks:
        for line in block.lines:
            table = next((i for i, (box, _) in enumerate(tables) if _inside(line, box)), None)
            if table is None:
                run.append(line)
                continue
            if run:
                runs.append(Block(list(run)))
                run.clear()
            if table not in written:
                flush()
                written.add(table)
                pieces.append(PageText(tables[table][1], [0], []))
        if run:  # a block's lines stay one block, so prose keeps its joins
            runs.append(Block(list(run)))
            run.clear()
    flush()
    for index, (_, markdown) in enumerate(tables):
        if index not in written:  # a table whose cells the text layer did not place
            pieces.append(PageText(markdown, [0], []))
    parts: list[str] = []
    starts: list[int] = []
    joins: list[tuple[int, str]] = []
    offset = 0
    for piece in pieces:
        if not piece.text:
            continue
        if parts:
            parts.append("\n\n")
            offset += 2
        starts.extend(offset + at for at in piece.starts)
        joins.extend((offset + at, key) for at, key in piece.joins)
        parts.append(piece.text)
        offset += len(piece.text)
    return PageText("".join(parts), starts, joins)

"""Turning a PDF page's text layout into prose: reading order, wrapped lines, hyphenation.

A PDF stores text as positioned lines, not paragraphs. Taken as is, a chunk keeps every hard
line break, words hyphenated at a line end stay in two halves ("asso-" / "ciated": neither half
is found by full-text search, and both weaken the embedding), and a page may list its blocks in
whatever order its producer drew them. This module works on the geometry MuPDF reports (blocks
of lines with bounding boxes) and decides, for each pair of consecutive lines, how to join them:

* a line that ends in a word hyphen is joined to the next line without a space. The hyphen is
  removed only where the halves make one word: a lowercase letter on both sides, no other hyphen
  in the first half ("state-of-the-" / "art" keeps it). "COVID-" / "19" and "EU-" / "Staaten"
  keep their hyphen. The removals are recorded (:attr:`PageText.joins`) and, once the whole
  document is read, :func:`restore_hyphens` puts back those of words the document prints
  hyphenated inside a line ("dual-encoder" on page 2 makes "dual-" / "encoder" on page 1
  hyphenated again). A soft hyphen (U+00AD) at a line end is always removed;
* a line the next line's first word would not have fitted after (so the text wrapped) is joined
  with a space; lines on one baseline (table cells, split spans) too;
* any other line break (a short line, a list item, an indented first line) is kept as ``\\n``;
  blocks are separated by a blank line unless the next block continues the last one's
  paragraph (directly below it, a wrapped or hyphenated line, a lowercase start).

Reading order: when a page has column gutters (vertical strips that only a few lines, such as a
title or a full-width figure, cross, with prose on both sides), its blocks are read column by
column, top to bottom, between the blocks that span the columns; otherwise MuPDF's order is kept.

Every step is linear in the number of characters (plus a sort of the blocks), with no regular
expressions, so hostile text cannot make it slow (``tests/test_pdf_text.py`` counts the work).
MuPDF's own ``TEXT_DEHYPHENATE`` flag was tried first: with pymupdf 1.28.2 it changed nothing in
``get_text("text")`` output (the 225 line-end hyphens of the two-column sample paper stayed),
and it could not tell "COVID-" / "19" from "asso-" / "ciated" anyway.
"""

from __future__ import annotations

import bisect
import math
import unicodedata
from dataclasses import dataclass, field

HYPHENS = frozenset("-\u2010")  # HYPHEN-MINUS and HYPHEN; dashes (en, em) are not hyphens
SOFT_HYPHEN = "\u00ad"
BULLETS = frozenset("•◦▪▫‣⁃∙·●○■□►▶➢✓✔*–—")
_SENTENCE_END = frozenset(".!?:;")
_PUNCTUATION = ".,;:!?()[]\"'“”‘’"
_BINS = 1024  # resolution of the column search across the text's width
_MIN_GUTTER = 4.0  # points: the narrowest gap taken for a column gutter (a 3-column register: 7)
_GUTTER_COVERAGE = 0.3  # a gutter is crossed by at most this share of the busiest x-position
_MIN_COLUMN_SHARE = 0.12  # each column holds at least this share of the page's text height
_MIN_COLUMN_LINE = 15  # characters per line on average: shorter columns are table cells
# Pages with more characters than this keep MuPDF's plain text: the layout ("dict") output costs
# about 1 KB of Python objects per span, and a hostile page can make every character a span.
MAX_LAYOUT_CHARS = 50_000
_MAX_GUTTERS = 8  # more gutter candidates than this is no column layout (and bounds the work)


@dataclass(slots=True)
class Line:
    text: str  # stripped; never empty
    x0: float
    y0: float
    x1: float
    y1: float
    size: float = 0.0  # the largest font size in the line (0: unknown)


@dataclass(slots=True)
class Block:
    lines: list[Line]
    x0: float = 0.0
    y0: float = 0.0
    x1: float = 0.0
    y1: float = 0.0
    chars: int = field(default=0)

    def __post_init__(self) -> None:
        if self.lines and not (self.x0 or self.y0 or self.x1 or self.y1):
            self.x0 = min(line.x0 for line in self.lines)
            self.y0 = min(line.y0 for line in self.lines)
            self.x1 = max(line.x1 for line in self.lines)
            self.y1 = max(line.y1 for line in self.lines)
        self.chars = sum(len(line.text) for line in self.lines)


def page_blocks(page, flags: int) -> list[Block]:
    """The text blocks of a pymupdf page in MuPDF's order, empty lines and blocks left out."""
    return blocks_from_dict(page.get_text("dict", flags=flags))


def blocks_from_dict(data: dict) -> list[Block]:
    """:func:`page_blocks` from MuPDF's ``"dict"`` output."""
    blocks = []
    for raw in data["blocks"]:
        if raw.get("type", 0) != 0:
            continue
        lines = []
        for raw_line in raw.get("lines", ()):
            text = "".join(span["text"] for span in raw_line["spans"]).replace("\x00", "").strip()
            if text:
                # A damaged or hostile font can give infinite or NaN boxes: such a line keeps
                # its text and gets an empty box (it then joins no column).
                box = [value if math.isfinite(value) else 0.0 for value in raw_line["bbox"]]
                sizes = [span.get("size") for span in raw_line["spans"] if span["text"]]
                finite = [
                    float(s) for s in sizes if isinstance(s, int | float) and math.isfinite(s)
                ]
                size = max(finite, default=0.0)
                lines.append(Line(text, *box, size=size))
        if lines:
            blocks.append(Block(lines))
    return blocks


# --- reading order ---------------------------------------------------------------------------


def _gutters(lines: list[Line]) -> list[tuple[float, float]]:
    """Column gutters: x-intervals few lines cross, with enough prose on each side."""
    left = min(line.x0 for line in lines)
    right = max(line.x1 for line in lines)
    width = right - left
    if width <= 2 * _MIN_GUTTER:
        return []
    step = width / _BINS

    def to_bin(x: float) -> int:
        return min(_BINS - 1, max(0, int((x - left) / step)))

    # Height of text covering each x-position: a difference array, O(lines + bins).
    delta = [0.0] * (_BINS + 1)
    for line in lines:
        height = max(line.y1 - line.y0, 1.0)
        delta[to_bin(line.x0)] += height
        delta[to_bin(line.x1) + 1] -= height
    coverage, running = [], 0.0
    for value in delta[:_BINS]:
        running += value
        coverage.append(running)
    threshold = _GUTTER_COVERAGE * max(coverage)
    runs: list[tuple[float, float]] = []
    start = None
    for index, value in enumerate([*coverage, threshold + 1]):
        if value <= threshold and start is None:
            start = index
        elif value > threshold and start is not None:
            # Bins touching a line's edge are partly covered: keep only whole bins inside.
            low, high = left + (start + 1) * step, left + index * step
            if start > 0 and index < _BINS and high - low >= _MIN_GUTTER:
                runs.append((low, high))
            start = None
    if len(runs) > _MAX_GUTTERS:
        return []  # scattered text (a chart, a table of narrow cells), not columns of prose
    # Drop gutters that leave a column without prose (a margin note, a table's cell columns).
    while runs:
        columns = _columns(lines, runs)
        total = sum(mass for mass, _, _ in columns) or 1.0
        weak = [
            index
            for index, (mass, chars, count) in enumerate(columns)
            if mass < _MIN_COLUMN_SHARE * total or chars < _MIN_COLUMN_LINE * max(count, 1)
        ]
        if not weak:
            return runs
        index = min(weak, key=lambda i: columns[i][0])
        # Merge the weak column into a neighbour by removing the gutter beside it.
        if index == 0:
            del runs[0]
        elif index == len(runs):
            del runs[-1]
        else:
            del runs[index if columns[index + 1][0] < columns[index - 1][0] else index - 1]
    return []


def _crosses(box: Line | Block, gutters: list[tuple[float, float]]) -> bool:
    return any(box.x0 < low and box.x1 > high for low, high in gutters)


def _column_of(box: Line | Block, lows: list[float]) -> int:
    return bisect.bisect_right(lows, (box.x0 + box.x1) / 2)


def _columns(lines: list[Line], gutters: list[tuple[float, float]]):
    """(text height, characters, lines) per column, lines crossing a gutter left out."""
    lows = [low for low, _ in gutters]
    columns = [[0.0, 0, 0] for _ in range(len(gutters) + 1)]
    for line in lines:
        if _crosses(line, gutters):
            continue
        column = columns[_column_of(line, lows)]
        column[0] += line.y1 - line.y0
        column[1] += len(line.text)
        column[2] += 1
    return columns


def _right_to_left(blocks: list[Block]) -> bool:
    strong = {"L": 0, "R": 0}
    for block in blocks:
        for line in block.lines:
            for char in line.text:
                kind = unicodedata.bidirectional(char)
                if kind == "L":
                    strong["L"] += 1
                elif kind in ("R", "AL"):
                    strong["R"] += 1
    return strong["R"] > strong["L"]


def reading_order(blocks: list[Block]) -> list[Block]:
    """The blocks in reading order: column by column where the page has columns.

    Blocks crossing a gutter (a title, a full-width figure or table) cut the page into bands;
    each band is read column by column (right to left for right-to-left scripts), each column
    top to bottom. Without gutters MuPDF's own order (the producer's) is kept.
    """
    lines = [line for block in blocks for line in block.lines]
    if len(lines) < 2:
        return list(blocks)
    gutters = _gutters(lines)
    if not gutters:
        return list(blocks)
    lows = [low for low, _ in gutters]
    spanning: list[Block] = []
    columnar: list[Block] = []
    for block in blocks:
        if any(_crosses(line, gutters) for line in block.lines):
            spanning.append(block)
            continue
        # MuPDF may put lines of two columns in one block (a page drawn row by row): split it.
        parts: dict[int, list[Line]] = {}
        for line in block.lines:
            parts.setdefault(_column_of(line, lows), []).append(line)
        columnar.extend([block] if len(parts) == 1 else [Block(part) for part in parts.values()])
    spanning.sort(key=lambda b: (b.y0, b.x0))
    cuts = [(block.y0 + block.y1) / 2 for block in spanning]
    bands: list[list[list[Block]]] = [
        [[] for _ in range(len(gutters) + 1)] for _ in range(len(spanning) + 1)
    ]
    for block in columnar:
        band = bisect.bisect_right(cuts, (block.y0 + block.y1) / 2)
        bands[band][_column_of(block, lows)].append(block)
    rtl = _right_to_left(blocks)
    ordered: list[Block] = []
    for index, band in enumerate(bands):
        for column in reversed(band) if rtl else band:
            ordered.extend(sorted(column, key=lambda b: (b.y0, b.x0)))
        if index < len(spanning):
            ordered.append(spanning[index])
    return ordered


# --- joining lines -----------------------------------------------------------------------------


def _first_word(text: str) -> str:
    end = text.find(" ")
    return text if end < 0 else text[:end]


def _last_word(text: str) -> str:
    return text[text.rfind(" ") + 1 :]


def _wrapped(line: Line, following: Line, right: float) -> bool:
    """Whether ``following``'s first word would not have fitted at the end of ``line``."""
    char_width = (following.x1 - following.x0) / max(len(following.text), 1)
    needed = (len(_first_word(following.text)) + 1) * char_width
    return line.x1 + needed >= right - 0.5 * char_width


def _same_baseline(line: Line, following: Line) -> bool:
    overlap = min(line.y1, following.y1) - max(line.y0, following.y0)
    return overlap > 0.5 * min(line.y1 - line.y0, following.y1 - following.y0)


def _is_list_item(text: str) -> bool:
    first = text[0]
    if first in BULLETS or text.startswith("- "):
        return True
    # "1." "12)" "a)" "(iv)": a short marker followed by a space
    marker = _first_word(text)
    if len(marker) > 5 or len(marker) == len(text):
        return False
    if marker[-1] in ".)" and len(marker) <= 3 and (marker[:-1].isdigit() or marker[0].isalpha()):
        return True  # "1." "12)" "a)", not "2019)"
    return marker[0] == "(" and marker[-1] == ")" and len(marker) <= 5


def hyphenated_words(blocks: list[Block], into: set[str]) -> set[str]:
    """Add the hyphenated words printed inside lines (not at their end) to ``into``, lowercased."""
    for block in blocks:
        for line in block.lines:
            text = line.text
            if "-" not in text[:-1]:
                continue
            for word in text.split():
                if "-" in word[1:-1]:
                    into.add(word.strip(_PUNCTUATION).lower())
    return into


def compound_key(head: str, tail: str) -> str:
    """How a hyphenated word made of ``head`` and ``tail`` is looked up in the compounds."""
    return f"{_last_word(head)}-{_first_word(tail)}".strip(_PUNCTUATION).lower()


def _hyphen_join(text: str, following: str) -> tuple[str, bool] | None:
    """How ``text`` (ending in a hyphen) continues into ``following``: the text for ``text``'s
    part and whether a hyphen was removed from it, or None without a word hyphen at the end."""
    last = text[-1]
    if last == SOFT_HYPHEN:
        return text[:-1], False
    if last not in HYPHENS or len(text) < 2 or not text[-2].isalpha():
        return None
    head = _last_word(text[:-1])
    keep = not text[-2].islower() or not following[0].islower() or "-" in head or "\u2010" in head
    return (text, False) if keep else (text[:-1], True)


def _separator(line: Line, following: Line, right: float, row: bool):
    """(text of ``line`` as joined, separator before ``following``, whether a hyphen was
    removed). ``row``: ``line`` is a cell of a row (on one baseline with the line before it
    and apart from it), so a new baseline is a new row."""
    joined = _hyphen_join(line.text, following.text)
    if joined is not None:
        return joined[0], "", joined[1]
    text, separator = _layout_separator(line, following, right, row)
    return text, separator, False


def _layout_separator(line: Line, following: Line, right: float, row: bool):
    if _is_list_item(following.text):
        return line.text, "\n"
    if _same_baseline(line, following):
        return line.text, " "
    if row:
        return line.text, "\n"
    indent = following.x0 - line.x0
    if indent > 0.8 * (following.y1 - following.y0) and line.text[-1] in _SENTENCE_END:
        return line.text, "\n"  # an indented first line: a new paragraph
    if _wrapped(line, following, right):
        return line.text, "" if _wide(line.text[-1]) and _wide(following.text[0]) else " "
    return line.text, "\n"


def _wide(char: str) -> bool:
    """Chinese, Japanese and Korean characters: their lines wrap without a space."""
    return unicodedata.east_asian_width(char) in ("W", "F")


def _continues(block: Block, following: Block) -> bool:
    """Whether ``following`` carries on ``block``'s last paragraph (MuPDF split it)."""
    last, first = block.lines[-1], following.lines[0]
    if not first.text[0].islower():
        return False
    height = max(last.y1 - last.y0, 1.0)
    # The next line starts lower, at most a line's gap below (a formula in a line makes its box
    # taller than the text, so the next line may start a little above the box's bottom).
    below = first.y0 > last.y0 and -0.5 * height <= first.y0 - last.y1 <= 0.8 * height
    overlap = min(block.x1, following.x1) - max(block.x0, following.x0)
    aligned = overlap > 0.5 * min(block.x1 - block.x0, following.x1 - following.x0)
    # The top of the next column: a paragraph running on from the bottom of the last one.
    next_column = following.x0 >= block.x1 - height and following.y0 < block.y1
    if not ((below and aligned) or next_column):
        return False
    if last.text[-1] in HYPHENS or last.text[-1] == SOFT_HYPHEN:
        return True
    right = max(block.x1, following.x1) if below and aligned else block.x1
    return _wrapped(last, first, right)


@dataclass
class PageText:
    text: str
    starts: list[int]  # where each block's text starts
    joins: list[tuple[int, str]]  # (offset, compound key) of each hyphen removed at a line end


def page_text(blocks: list[Block]) -> PageText:
    """The page's prose, where each block starts in it, and the hyphens removed."""
    parts: list[str] = []
    starts: list[int] = []
    joins: list[tuple[int, str]] = []
    offset = 0
    previous: Block | None = None
    pending: Line | None = None  # the last line seen, not yet written (its join is unknown)

    def add(line: Line, following: Line, text: str, separator: str, removed: bool) -> None:
        nonlocal offset
        if removed:
            joins.append((offset + len(text), compound_key(line.text[:-1], following.text)))
        parts.append(text)
        parts.append(separator)
        offset += len(text) + len(separator)

    for block in blocks:
        if pending is not None and previous is not None:
            first = block.lines[0]
            if _continues(previous, block):
                text, separator, removed = _separator(
                    pending, first, max(previous.x1, block.x1), False
                )
                add(pending, first, text, " " if separator == "\n" else separator, removed)
            else:
                add(pending, first, pending.text, "\n\n", False)
        starts.append(offset)
        lines = block.lines
        row = False
        for index in range(len(lines) - 1):
            line, following = lines[index], lines[index + 1]
            text, separator, removed = _separator(line, following, block.x1, row)
            # Cells of a row sit apart; a sentence split in two on one baseline does not.
            row = (
                separator == " "
                and _same_baseline(line, following)
                and following.x0 - line.x1 > 1.5 * (line.y1 - line.y0)
            )
            add(line, following, text, separator, removed)
        pending, previous = lines[-1], block
    if pending is not None:
        parts.append(pending.text)
    return PageText("".join(parts), starts, joins)


def restore_hyphens(
    text: str, joins: list[tuple[int, str]], compounds: set[str]
) -> tuple[str, list[int]]:
    """Put back the removed hyphens of words the document prints hyphenated inside a line
    ("well-" / "known" when "well-known" appears whole elsewhere). ``joins`` are in text order;
    returns the new text and the offsets (in the old text) where a hyphen went back, in order."""
    restored = [offset for offset, key in joins if key in compounds]
    if not restored:
        return text, []
    parts, previous = [], 0
    for offset in restored:
        parts.append(text[previous:offset])
        parts.append("-")
        previous = offset
    parts.append(text[previous:])
    return "".join(parts), restored

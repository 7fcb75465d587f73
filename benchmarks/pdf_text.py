"""PDF text quality before and after the prose cleaning of ``PdfParser``.

    python benchmarks/pdf_text.py                        # ../shared/data/pdfs
    python benchmarks/pdf_text.py --data DIR --json      # any folder of PDFs; JSON out

"Before" is the parser's former extraction, ``page.get_text("text")`` per page (MuPDF's block
order, one line per printed line, ligatures kept); "after" is ``parse_file``. Both texts are cut
by the default chunker (``TokenChunker(chunk_size=200, chunk_overlap=40)``, with its built-in
token estimate instead of a model's tokenizer, so no model is loaded), and each chunk is checked
for:

* a **hyphen-broken word**: a letter, a hyphen (``-``, U+2010 or a soft hyphen), optional spaces,
  a line break, optional whitespace, then a lowercase letter ("asso-\\nciated"). The "loose"
  count also takes a hyphen followed by spaces alone ("asso- ciated"), which is what joining
  lines without de-hyphenating would leave (it also counts real suspended hyphens such as
  "pre- and post-", in both columns alike);
* **interleaved columns**: two consecutive prose blocks of one page (MuPDF blocks of at least
  40 characters; figure labels, formula pieces and margin stamps are skipped) where the second
  lies wholly left of the first and starts above the first one's bottom, i.e. the text goes
  back to an earlier column at a height it had already passed. A chunk counts when it holds
  the start of the second block (and text before it). This uses only the blocks' positions,
  not the column detection under test.

De-hyphenation decisions are checked against the document itself, with no dictionary: for each
line-end break "head-" / "tail" of the before text, the word is *attested joined* when
"headtail" occurs whole inside a line elsewhere in the same document, *attested hyphenated*
when "head-tail" does; the after text is then searched for either form.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

HYPHENS = "-\u2010\u00ad"
PROSE_CHARS = 40
LIGATURES = str.maketrans(
    {"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl"}
)
WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


def configure() -> None:
    from django.conf import settings

    if not settings.configured:
        settings.configure(DJANGO_RAG={})


def broken_words(text: str, *, loose: bool = False) -> list[int]:
    """Offsets of the hyphens of hyphen-broken words (see the module docstring)."""
    found = []
    position = 0
    length = len(text)
    while True:
        candidates = [text.find(h, position) for h in HYPHENS]
        candidates = [c for c in candidates if c >= 0]
        if not candidates:
            return found
        at = min(candidates)
        position = at + 1
        if at == 0 or not text[at - 1].isalpha():
            continue
        index, newline = at + 1, False
        while index < length and text[index] in " \t\r\n\f\v":
            newline = newline or text[index] == "\n"
            index += 1
        if index == at + 1 or index >= length or not text[index].islower():
            continue
        if newline or loose:
            found.append(at)


def backtracks(blocks) -> list[int]:
    """Indexes i (in ``blocks``) where prose goes back to an earlier column (see above).

    Only blocks of at least ``PROSE_CHARS`` characters are compared (each with the previous
    such block): labels in a figure, pieces of a formula and margin stamps are no column.
    """
    prose = [index for index, block in enumerate(blocks) if block.chars >= PROSE_CHARS]
    return [
        index
        for previous, index in zip(prose, prose[1:], strict=False)
        if blocks[index].x1 <= blocks[previous].x0 and blocks[index].y0 < blocks[previous].y1 - 1
    ]


def block_offsets(text: str, blocks, start: int) -> list[int]:
    """Where each block's first line starts in ``text`` (searched forward from ``start``)."""
    offsets, cursor = [], start
    for block in blocks:
        probe = block.lines[0].text.rstrip(HYPHENS)[:40].strip()
        found = text.find(probe, cursor) if probe else -1
        offsets.append(found if found >= 0 else cursor)
        cursor = max(cursor, found + 1 if found >= 0 else cursor)
    return offsets


def chunks_of(text: str):
    from django_rag.ingestion.chunkers import TokenChunker

    return TokenChunker(chunk_size=200, chunk_overlap=40).chunk(text)


def share(chunks, offsets: list[int]) -> int:
    """Chunks holding at least one of ``offsets`` strictly inside them."""
    offsets = sorted(offsets)
    import bisect

    count = 0
    for chunk in chunks:
        index = bisect.bisect_right(offsets, chunk.start)
        if index < len(offsets) and offsets[index] < chunk.end:
            count += 1
    return count


def measure(path: Path) -> dict | None:
    import pymupdf

    from django_rag.exceptions import RagError
    from django_rag.ingestion.parsers import parse_file
    from django_rag.ingestion.pdftext import page_blocks, reading_order

    started = time.perf_counter()
    try:
        parsed = parse_file(path)
    except RagError as exc:
        return {"file": path.name, "skipped": type(exc).__name__}
    after_seconds = time.perf_counter() - started
    flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES
    before_parts, before_jumps, after_jumps, before_lines = [], [], [], []
    offset = 0
    before_seconds = 0.0
    with pymupdf.open(path) as document:
        for number, page in enumerate(document):
            started = time.perf_counter()
            text = page.get_text("text").replace("\x00", "").strip()
            before_seconds += time.perf_counter() - started
            if before_parts:
                offset += 2
            before_lines.extend(text.split("\n"))
            native = page_blocks(page, flags)
            starts = block_offsets(text, native, 0)
            before_jumps += [offset + starts[i] for i in backtracks(native)]
            ordered = reading_order(native)
            span = parsed.pages[number]
            page_after = parsed.text[span.start : span.end]
            starts = block_offsets(page_after, ordered, 0)
            after_jumps += [span.start + starts[i] for i in backtracks(ordered)]
            before_parts.append(text)
            offset += len(text)
    before = "\n\n".join(before_parts)

    # De-hyphenation checked against the document's own words (ligatures expanded in the before
    # text too, so "efﬁ-" / "ciently" compares with "efficiently").
    checked = before.translate(LIGATURES)
    before_lines = [line.translate(LIGATURES) for line in before_lines]
    whole = Counter(word.lower() for line in before_lines for word in WORD.findall(line))
    after_words = Counter(word.lower() for word in WORD.findall(parsed.text))
    checks = Counter()
    for at in broken_words(checked):
        head = WORD.findall(checked[max(0, at - 60) : at])
        tail_match = WORD.match(checked, len(checked) - len(checked[at + 1 :].lstrip()))
        if not head or not tail_match:
            continue
        head, tail = head[-1].split("-")[-1].lower(), tail_match.group().split("-")[0].lower()
        joined, hyphenated = head + tail, f"{head}-{tail}"
        attested = (
            "joined" if whole[joined] else "hyphenated" if whole[hyphenated] else "unattested"
        )
        if after_words[hyphenated] > whole[hyphenated]:
            outcome = "kept"
        elif after_words[joined] > whole[joined]:
            outcome = "joined"
        else:
            outcome = "other"
        checks[f"{attested}/{outcome}"] += 1

    before_chunks, after_chunks = chunks_of(before), chunks_of(parsed.text)
    return {
        "file": path.name,
        "pages": len(parsed.pages),
        "chunks": [len(before_chunks), len(after_chunks)],
        "broken": [
            share(before_chunks, broken_words(before)),
            share(after_chunks, broken_words(parsed.text)),
        ],
        "broken_loose": [
            share(before_chunks, broken_words(before, loose=True)),
            share(after_chunks, broken_words(parsed.text, loose=True)),
        ],
        "interleaved": [share(before_chunks, before_jumps), share(after_chunks, after_jumps)],
        "backtracks": [len(before_jumps), len(after_jumps)],
        "hyphen_checks": dict(checks),
        "seconds": [round(before_seconds, 3), round(after_seconds, 3)],
        "characters": [len(before), len(parsed.text)],
    }


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT / ".." / "shared" / "data" / "pdfs"))
    parser.add_argument("--json", action="store_true", help="print one JSON object per file")
    options = parser.parse_args()
    configure()
    rows = [measure(path) for path in sorted(Path(options.data).glob("*.pdf"))]
    rows = [row for row in rows if row]
    if options.json:
        for row in rows:
            print(json.dumps(row))
    measured = [row for row in rows if "skipped" not in row]
    totals = {
        key: [sum(row[key][side] for row in measured) for side in (0, 1)]
        for key in ("chunks", "broken", "broken_loose", "interleaved", "backtracks", "seconds")
    }
    checks = Counter()
    for row in measured:
        checks.update(row["hyphen_checks"])
    print(f"{'file':48} {'chunks':>9} {'broken':>9} {'loose':>9} {'interleaved':>11}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['file']:48} skipped: {row['skipped']}")
            continue
        cells = [f"{row[key][0]}->{row[key][1]}" for key in ("chunks", "broken", "broken_loose")]
        cells.append(f"{row['interleaved'][0]}->{row['interleaved'][1]}")
        print(f"{row['file']:48} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9} {cells[3]:>11}")
    chunks = totals["chunks"]
    for key, label in (
        ("broken", "chunks with a hyphen-broken word (line break)"),
        ("broken_loose", "chunks with a hyphen-broken word (loose)"),
        ("interleaved", "chunks with interleaved columns"),
    ):
        before, after = totals[key]
        print(
            f"{label}: before {before}/{chunks[0]} ({percent(before, chunks[0])}), "
            f"after {after}/{chunks[1]} ({percent(after, chunks[1])})"
        )
    print(
        f"column backtracks (block junctions): before {totals['backtracks'][0]}, "
        f"after {totals['backtracks'][1]}"
    )
    print("line-end hyphens, attested form/outcome:", dict(sorted(checks.items())))
    print(
        f"time, all files: get_text('text') per page {totals['seconds'][0]:.2f} s; "
        f"parse_file (page budgets, extraction, cleaning) {totals['seconds'][1]:.2f} s"
    )


if __name__ == "__main__":
    main()

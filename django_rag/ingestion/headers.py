"""Chunk headers at ingest: each chunk's document title and heading path.

With ``DJANGO_RAG["CHUNK_HEADERS"]`` on, every new chunk gets ``metadata["header"]``: the
document's title and, for Markdown text, the headings above the chunk ("Guide > Install >
Linux"). What it is used for, and how re-embedding keeps it, is in
:mod:`django_rag.store.headers`. A chunk that already has a header (a custom chunker's) keeps
it.

Headings are ATX Markdown headings (``#`` to ``######`` at a line start) outside fenced code
blocks; a heading's path replaces every deeper one before it. One pass over the text and one
over the chunks (sorted by offset): linear in the text's length.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from ..conf import get_setting
from ..store.headers import HEADER_KEY, MAX_HEADER_CHARS, header_of, with_header
from .chunkers import TextChunk

_HEADING = re.compile(r"(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCES = ("```", "~~~")
_SEPARATOR = " > "


def heading_marks(text: str) -> tuple[list[int], list[tuple[str, ...]]]:
    """``(offsets, paths)``: where each Markdown heading starts and the path it opens."""
    offsets: list[int] = []
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[int, str]] = []
    fence = ""
    position = 0
    for line in text.splitlines(keepends=True):
        start = position
        position += len(line)
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = ""
            continue
        if stripped.startswith(_FENCES):
            fence = stripped[:3]
            continue
        if not line.startswith("#"):
            continue
        match = _HEADING.match(line.rstrip("\r\n"))
        if match is None or not match.group(2):
            continue
        level = len(match.group(1))
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, " ".join(match.group(2).split())))
        offsets.append(start)
        paths.append(tuple(name for _, name in stack))
    return offsets, paths


def header_text(title: str, path: Sequence[str]) -> str:
    """A chunk header: the title, then the heading path on its own line (the path leaves out
    a first heading that repeats the title)."""
    title = " ".join((title or "").split())
    names = list(path)
    if names and title and names[0].casefold() == title.casefold():
        names = names[1:]
    lines = [line for line in (title, _SEPARATOR.join(names)) if line]
    return "\n".join(lines)[:MAX_HEADER_CHARS]


def chunk_headers(starts: Sequence[int | None], *, title: str, text: str, format: str) -> list[str]:
    """The header of a chunk starting at each of ``starts`` in ``text`` ("" for none): the
    title and, for Markdown, the path of the last heading at or before the chunk's start (a
    chunk opening with a heading is under it, not under the sibling before it)."""
    offsets, paths = heading_marks(text) if format == "markdown" else ([], [])
    headers = []
    for start in starts:
        path: tuple[str, ...] = ()
        if offsets and start is not None:
            index = bisect.bisect_right(offsets, start) - 1
            if index >= 0:
                path = paths[index]
        headers.append(header_text(title, path))
    return headers


def add_headers(chunks: list[TextChunk], *, title: str, text: str, format: str) -> None:
    """Give each chunk without one its header (title and heading path) in ``metadata``."""
    bare = [chunk for chunk in chunks if not isinstance(chunk.metadata.get(HEADER_KEY), str)]
    headers = chunk_headers([c.start for c in bare], title=title, text=text, format=format)
    for chunk, header in zip(bare, headers, strict=True):
        if header:
            chunk.metadata = {**chunk.metadata, HEADER_KEY: header}


def headers_enabled() -> bool:
    return bool(get_setting("CHUNK_HEADERS"))


def embedding_inputs(chunks: Sequence[TextChunk]) -> list[str]:
    """What the embedder reads for each chunk: its text after its header (if any)."""
    return [with_header(chunk.text, header_of(chunk.metadata)) for chunk in chunks]

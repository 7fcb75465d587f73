"""Chunk headers: what a chunk is embedded and indexed as, besides its stored text.

A chunk may carry a header in ``metadata["header"]`` (its document's title and heading path,
set at ingest when ``DJANGO_RAG["CHUNK_HEADERS"]`` is on, see
:mod:`django_rag.ingestion.headers`; a custom chunker may set its own). The header is put
before the chunk's text in what the embedder reads and in the full-text vector, at ingest and
at every re-embedding or re-indexing, while ``Chunk.text`` stays the document's own text (so
offsets, windows and what a reader sees are unchanged). The header travels with the chunk:
turning the setting off changes new chunks only.
"""

from __future__ import annotations

from typing import Any

HEADER_KEY = "header"
#: Characters of a header kept: a title and heading path, not a second chunk.
MAX_HEADER_CHARS = 300


def header_of(metadata: Any) -> str:
    """The chunk header in ``metadata`` ("" without one, or when it is not a string)."""
    if not isinstance(metadata, dict):
        return ""
    header = metadata.get(HEADER_KEY)
    return header[:MAX_HEADER_CHARS] if isinstance(header, str) else ""


def with_header(text: str, header: str | None) -> str:
    """What a chunk is embedded and indexed as: ``header``, a blank line, then ``text``."""
    return f"{header}\n\n{text}" if header else text


def indexed_sql(text: str = "text", metadata: str = "metadata") -> str:
    """:func:`with_header` in SQL, over the columns (or expressions) ``text`` and ``metadata``."""
    return (
        f"coalesce(left({metadata} ->> '{HEADER_KEY}', {MAX_HEADER_CHARS}) || E'\\n\\n', '') "
        f"|| {text}"
    )

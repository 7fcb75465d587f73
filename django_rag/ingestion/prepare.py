"""Chunking and embedding a parsed document: no database access.

``prepare_chunks`` is what every ingest path runs between parsing and storing (the memory
store's ``ingest`` too): split with the chunker, embed in batches (naming the first chunk the
embedder refuses, or skipping it with ``on_error="skip"``), pair chunks with vectors and pages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..conf import scrub_text
from ..embeddings import Embedder
from ..exceptions import EmbeddingFailed, EmptyDocument
from ..signals import span
from ..store import ChunkRow
from ..validation import check_vectors
from .chunkers import Chunker, TextChunk
from .headers import add_headers, embedding_inputs, headers_enabled
from .parsers import ParsedDocument

#: The longest reason kept for a chunk that was skipped.
MAX_REASON = 200


@dataclass
class PreparedChunk:
    chunk_index: int
    chunk: TextChunk
    embedding: list[float]
    page_start: int | None = None
    page_end: int | None = None

    def row(self) -> ChunkRow:
        return ChunkRow(
            chunk_index=self.chunk_index,
            text=self.chunk.text,
            embedding=self.embedding,
            token_count=self.chunk.token_count,
            start_char=self.chunk.start,
            end_char=self.chunk.end,
            page_start=self.page_start,
            page_end=self.page_end,
            metadata=self.chunk.metadata,
        )


def chunk_text(
    parsed: ParsedDocument,
    *,
    chunker: Chunker,
    embedder: Embedder,
    title: str | None = None,
) -> list[TextChunk]:
    """Split ``parsed.text`` with ``chunker`` (an ingest request's, its sizes applied). With
    ``CHUNK_HEADERS`` on, each chunk gets its header (``title``, default the parsed title, and
    its heading path; :mod:`.headers`)."""
    name = getattr(chunker, "name", None) or type(chunker).__name__
    with span("chunk", chunker=name, format=parsed.format, chars=len(parsed.text)) as s:
        chunks = chunker.chunk(parsed.text, format=parsed.format, embedder=embedder)
        s.set(chunk_count=len(chunks))
    if not chunks:
        raise EmptyDocument("The chunker produced no chunks for this document.")
    if headers_enabled():
        add_headers(
            chunks,
            title=parsed.title if title is None else title,
            text=parsed.text,
            format=parsed.format,
        )
    return chunks


def attach_vectors(
    parsed: ParsedDocument,
    chunks: list[TextChunk],
    vectors: Sequence[list[float] | None],
    *,
    embedder: Embedder,
    dimensions: int | None = None,
) -> list[PreparedChunk]:
    """Pair chunks with their vectors and pages, checking the vectors fit the column. A chunk
    whose vector is None (skipped with ``on_chunk_error="skip"``) is left out."""
    # Wrong sizes, zero or non-finite vectors never reach the column (a zero vector has no
    # cosine: it would score NaN in every search).
    check_vectors(
        [vector for vector in vectors if vector is not None], dimensions=dimensions, what="chunk"
    )
    prepared = []
    for index, (chunk, vector) in enumerate(zip(chunks, vectors, strict=True)):
        if vector is None:
            continue
        page_start, page_end = parsed.page_range(chunk.start, chunk.end)
        prepared.append(PreparedChunk(index, chunk, vector, page_start, page_end))
    return prepared


def prepare_chunks(
    parsed: ParsedDocument,
    *,
    chunker: Chunker,
    embedder: Embedder,
    on_error: str = "raise",
    dimensions: int | None = None,
) -> list[PreparedChunk]:
    """Chunk ``parsed.text`` with ``chunker`` and embed every chunk with ``embedder`` (both
    resolved: an ingest request's); raises before anything is stored."""
    chunks = chunk_text(parsed, chunker=chunker, embedder=embedder)
    vectors = embed_texts(embedder, embedding_inputs(chunks), on_error=on_error)
    return attach_vectors(parsed, chunks, vectors, embedder=embedder, dimensions=dimensions)


def embed_texts(
    embedder: Embedder,
    texts: Sequence[str],
    *,
    on_error: str = "raise",
    progress: Callable[[int, int], None] | None = None,
    reasons: dict[int, str] | None = None,
) -> list[list[float] | None]:
    """Embed ``texts`` in batches, longest first. A failure names a chunk that cannot be
    embedded (its index in ``texts``); with ``on_error="skip"`` such chunks get None instead
    (when some chunk embedded), and ``reasons`` (when given) gets why, by index.
    ``progress(done, total)`` is called after each batch (a background job's report, a
    command's progress bar)."""
    # Batches of similar lengths: a batch is padded to its longest text, so mixing short and
    # long chunks wastes model time (SentenceTransformer.encode sorts the same way).
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    ordered = [texts[i] for i in order]
    vectors: list[list[float] | None] = []
    size = max(1, int(getattr(embedder, "batch_size", 32) or 32))
    for start in range(0, len(ordered), size):
        batch = ordered[start : start + size]
        try:
            vectors.extend(embedder.embed_documents(batch))
        except Exception as exc:
            if on_error == "skip":
                for offset, (vector, error) in enumerate(_one_by_one(embedder, batch)):
                    vectors.append(vector)
                    if error is not None and reasons is not None:
                        reasons[order[start + offset]] = error
                if progress is not None:
                    progress(len(vectors), len(texts))
                continue
            index, cause = _failing_index(embedder, batch, exc)
            position = order[start + index]
            raise EmbeddingFailed(
                f"Embedding chunk {position} failed with {type(cause).__name__}: "
                f"{scrub_text(cause)}. "
                "Nothing was written; fix the embedder (or the text) and ingest again, or "
                "pass on_chunk_error='skip' to store the chunks that embed.",
                chunk_index=position,
            ) from cause
        if progress is not None:
            progress(len(vectors), len(texts))
    if on_error == "skip" and texts and all(vector is None for vector in vectors):
        raise EmbeddingFailed(
            "No chunk of this document could be embedded; nothing was written.", chunk_index=0
        )
    result: list[list[float] | None] = [None] * len(texts)
    for position, vector in zip(order, vectors, strict=True):
        result[position] = vector
    return result


def _one_by_one(
    embedder: Embedder, batch: list[str]
) -> list[tuple[list[float] | None, str | None]]:
    """Each text's vector, or None and why (the error, scrubbed of secrets and cut short: it
    goes to telemetry and the document's ``error``)."""
    vectors: list[tuple[list[float] | None, str | None]] = []
    for text in batch:
        try:
            (vector,) = embedder.embed_documents([text])
        except Exception as exc:
            vectors.append((None, f"{type(exc).__name__}: {scrub_text(exc)}"[:MAX_REASON]))
        else:
            vectors.append((vector, None))
    return vectors


def _failing_index(embedder: Embedder, batch: list[str], error: Exception):
    if len(batch) > 1:
        for index, text in enumerate(batch):
            try:
                embedder.embed_documents([text])
            except Exception as exc:
                return index, exc
    return 0, error

"""The steps every ingest path shares, one document at a time: validate, prepare, store.

1. :func:`validate` checks the input (:mod:`django_rag.validation`) and finds a stored duplicate;
2. :func:`prepare_document` chunks, embeds every chunk and extracts the graph when asked, before
   any write, so no transaction waits on a model or an LLM;
3. :func:`store_prepared` writes through :func:`django_rag.store.write_document`: the document,
   its chunks and their graph in one transaction, replacing older versions with
   ``replace=True`` (a write overtaken by a newer version of its identity returns
   :func:`superseded_result`).

:func:`assemble` turns chunks and their vectors into a :class:`Prepared` document; the batched
path (:mod:`~django_rag.ingestion.batch`) calls it once per document of a group.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..embeddings import Embedder, active_dimensions
from ..exceptions import DocumentSuperseded, InvalidOption
from ..graph.extractors import GraphExtractor
from ..models import Document
from ..models.databases import write_db
from ..signals import annotate
from ..store import next_versions, write_document
from ..store.documents import find_duplicate
from ..validation import (
    clean_collection_name,
    clean_metadata,
    clean_source_id,
    clean_text,
    clean_title,
)
from .chunkers import TextChunk
from .graphs import extract_graph
from .headers import embedding_inputs
from .parsers import ParsedDocument
from .parsers.base import TEXT_CONTENT_TYPES
from .prepare import PreparedChunk, attach_vectors, chunk_text, embed_texts
from .request import FORMATS, IngestRequest

logger = logging.getLogger(__name__)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Pending:
    """A validated document waiting for its chunks' vectors."""

    collection: str
    document: Document  # unsaved, or saved as pending for a worker
    parsed: ParsedDocument
    replace: bool
    chunks: list[TextChunk] = field(default_factory=list)


@dataclass
class Prepared:
    """A document's chunks with their vectors and (optionally) graph extractions."""

    chunks: list[PreparedChunk]
    extractions: list | None
    model_name: str
    skipped: list[int] = field(default_factory=list)
    #: Why each skipped chunk was skipped, by index.
    reasons: dict[int, str] = field(default_factory=dict)


def text_document(text: Any, format: Any) -> ParsedDocument:
    if format not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "html":
        # Converted in a bounded worker, as a file would be parsed (isolation.py).
        from .isolation import html_to_markdown_isolated

        if not isinstance(text, str):
            raise InvalidOption(f"text must be a string, got {type(text).__name__}")
        return ParsedDocument(
            text=html_to_markdown_isolated(text),
            format="markdown",
            content_type=TEXT_CONTENT_TYPES[format],
        )
    return ParsedDocument(text=text, format=format, content_type=TEXT_CONTENT_TYPES[format])


def validate(
    parsed: ParsedDocument,
    *,
    collection=None,
    title: str | None = "",
    metadata=None,
    source_id: str | None = None,
    replace: bool = False,
    filename: str = "",
    check_duplicate: bool = True,
):
    """Check one document's input; return a :class:`Pending`, or the stored duplicate
    (``check_duplicate=False`` leaves that to the caller: ``ingest_many`` checks a batch in one
    query)."""
    source_id = clean_source_id(source_id)
    title = clean_title(title)
    if replace and not source_id:
        raise InvalidOption(
            "replace=True needs a source_id: it replaces the document with the same "
            "(collection, source_id)."
        )
    parsed.text = clean_text(parsed.text)
    metadata = clean_metadata(metadata)
    name = clean_collection_name(collection)
    digest = content_hash(parsed.text)

    # Cheap dedup before any embedding work; checked again under the lock by the store.
    existing = find_duplicate(name, source_id, digest) if check_duplicate else None
    if existing is not None and not replace:
        existing.deduplicated = True
        return existing
    document = Document(
        source_id=source_id,
        title=(title or parsed.title or "")[:500],
        content=parsed.text,
        content_hash=digest,
        metadata={**parsed.metadata, **metadata},
        status=Document.Status.COMPLETED,
        original_filename=filename[:500],
        content_type=parsed.content_type,
    )
    return Pending(name, document, parsed, replace)


def take_versions(validated: Sequence[Pending]) -> None:
    """Give submitted documents their versions (one statement), before anything is embedded or
    queued: the order of versions is the order of the calls, whatever runs them later."""
    for item, version in zip(validated, next_versions(len(validated)), strict=True):
        item.document.version = version


def prepare_document(
    pending: Pending,
    request: IngestRequest,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Chunk and embed a validated document (and extract its graph) as ``request`` says: no
    database writes. ``progress(done, total)`` follows the embedding, chunk by chunk (a job's
    report)."""
    embedder = request.embedder
    chunks = pending.chunks or chunk_text(
        pending.parsed, chunker=request.chunker, embedder=embedder, title=pending.document.title
    )
    reasons: dict[int, str] = {}
    vectors = embed_texts(
        embedder,
        embedding_inputs(chunks),
        on_error=request.on_chunk_error,
        progress=progress,
        reasons=reasons,
    )
    return assemble(pending, chunks, vectors, embedder, request.graph, reasons, request.graph_store)


def assemble(
    pending: Pending,
    chunks,
    vectors,
    embedder: Embedder,
    graph: bool | GraphExtractor,
    reasons: dict[int, str] | None = None,
    graph_store: Any = None,
) -> Prepared:
    prepared = attach_vectors(
        pending.parsed, chunks, vectors, embedder=embedder, dimensions=active_dimensions()
    )
    skipped = [index for index, vector in enumerate(vectors) if vector is None]
    return Prepared(
        prepared,
        extract_graph(prepared, pending.collection, graph, graph_store=graph_store)
        if graph is not False
        else None,
        embedder.model_name,
        skipped,
        {index: (reasons or {}).get(index, "not embedded") for index in skipped},
    )


def store_prepared(pending: Pending, prepared: Prepared) -> Document:
    """Write a prepared document through the store (the one write path)."""
    # A retried background task's document still holds the failed attempt's error.
    pending.document.error = (
        f"{len(prepared.skipped)} chunk(s) could not be embedded and were skipped: "
        f"{prepared.skipped[:50]}; "
        + "; ".join(f"chunk {i}: {prepared.reasons[i]}" for i in prepared.skipped[:5])
        if prepared.skipped
        else ""
    )
    try:
        document = write_document(
            pending.document,
            [item.row() for item in prepared.chunks],
            collection=pending.collection,
            model_name=prepared.model_name,
            replace=pending.replace,
            extractions=prepared.extractions,
        )
    except DocumentSuperseded as exc:
        if pending.document.pk is not None:
            raise  # a queued document: its job ends superseded
        return superseded_result(pending, exc)
    document.superseded = False
    document.skipped_chunks = prepared.skipped
    annotate(
        "ingest",
        skipped_chunks=[
            {"index": i, "reason": prepared.reasons[i]} for i in prepared.skipped[:100]
        ],
        document={
            "id": document.pk,
            "collection": pending.collection,
            "source_id": document.source_id,
            "title": document.title,
            "content_type": document.content_type,
            "chars": len(document.content or ""),
            "chunk_count": len(prepared.chunks),
        },
    )
    return document


def superseded_result(pending: Pending, exc: DocumentSuperseded) -> Document:
    """What a foreground write overtaken by a newer version of its identity returns: like a
    duplicate, the document stored for the identity now (the newest), flagged
    ``superseded = True``, or its own unsaved document when the source was deleted."""
    current = (
        Document.objects.using(write_db())
        .filter(collection__name=pending.collection, source_id=pending.document.source_id)
        .order_by("-version")
        .first()
    ) or pending.document
    logger.info("%s", exc)
    current.superseded = True
    current.deduplicated = False
    current.skipped_chunks = []
    return current

"""The ingest service: text, files and bytes become a Document with embedded chunks.

Every chunk is embedded before anything is written; the document and all its chunks are then
written in one transaction, so a failure at any point leaves the database as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from ..embeddings import Embedder, active_dimensions, get_embedder
from ..exceptions import (
    DimensionMismatch,
    DocumentNotFound,
    EmbeddingFailed,
    EmptyDocument,
    InvalidOption,
    RagError,
)
from ..retrieval.fulltext import search_vectors
from ..signals import span
from ..validation import (
    clean_collection_name,
    clean_metadata,
    clean_source_id,
    clean_text,
    clean_title,
)
from .chunkers import TextChunk, get_chunker
from .parsers import ParsedDocument, parse_bytes, parse_file


@dataclass
class PreparedChunk:
    chunk_index: int
    chunk: TextChunk
    embedding: list[float]
    page_start: int | None = None
    page_end: int | None = None


# --- validation -------------------------------------------------------------------------------


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- chunk + embed (no database writes) ------------------------------------------------------


def chunk_text(
    parsed: ParsedDocument,
    *,
    chunker=None,
    embedder: Embedder,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
) -> list[TextChunk]:
    """Split ``parsed.text`` with the chunker (per-call sizes override its options)."""
    options = {
        key: value
        for key, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap))
        if value is not None
    }
    chunks = get_chunker(chunker, **options).chunk(
        parsed.text, format=parsed.format, embedder=embedder
    )
    if not chunks:
        raise EmptyDocument("The chunker produced no chunks for this document.")
    return chunks


def attach_vectors(
    parsed: ParsedDocument,
    chunks: list[TextChunk],
    vectors: list[list[float]],
    *,
    embedder: Embedder,
    dimensions: int | None = None,
) -> list[PreparedChunk]:
    """Pair chunks with their vectors and pages, checking the vectors fit the column."""
    if dimensions is not None and len(vectors[0]) != dimensions:
        raise DimensionMismatch(
            f"{embedder!r} returned {len(vectors[0])}-dimensional vectors but the embedding "
            f"column holds {dimensions}. Set DJANGO_RAG['EMBEDDING_DIMENSIONS'] to match the "
            "embedder and migrate the column (see docs/configuration.md, 'Changing the "
            "embedding model').",
            expected=dimensions,
            actual=len(vectors[0]),
        )
    prepared = []
    for index, (chunk, vector) in enumerate(zip(chunks, vectors, strict=True)):
        page_start, page_end = parsed.page_range(chunk.start, chunk.end)
        prepared.append(PreparedChunk(index, chunk, vector, page_start, page_end))
    return prepared


def prepare_chunks(
    parsed: ParsedDocument,
    *,
    chunker=None,
    embedder: Embedder,
    dimensions: int | None = None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
) -> list[PreparedChunk]:
    """Chunk ``parsed.text`` and embed every chunk; raises before anything is stored."""
    chunks = chunk_text(
        parsed,
        chunker=chunker,
        embedder=embedder,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
    )
    vectors = embed_texts(embedder, [chunk.text for chunk in chunks])
    return attach_vectors(parsed, chunks, vectors, embedder=embedder, dimensions=dimensions)


def embed_texts(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """Embed ``texts`` in batches; a failure names the first chunk that cannot be embedded."""
    vectors: list[list[float]] = []
    size = max(1, int(getattr(embedder, "batch_size", 32) or 32))
    for start in range(0, len(texts), size):
        batch = list(texts[start : start + size])
        try:
            vectors.extend(embedder.embed_documents(batch))
        except Exception as exc:
            index, cause = _failing_index(embedder, batch, exc)
            raise EmbeddingFailed(
                f"Embedding chunk {start + index} failed with {type(cause).__name__}: {cause}. "
                "Nothing was written; fix the embedder (or the text) and ingest again.",
                chunk_index=start + index,
            ) from cause
    return vectors


def _failing_index(embedder: Embedder, batch: list[str], error: Exception):
    if len(batch) > 1:
        for index, text in enumerate(batch):
            try:
                embedder.embed_documents([text])
            except Exception as exc:
                return index, exc
    return 0, error


# --- public entry points ----------------------------------------------------------------------


def ingest(
    text: str,
    *,
    collection: str | None = None,
    title: str = "",
    metadata: dict | None = None,
    source_id: str | None = None,
    replace: bool = False,
    format: str = "text",
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    background: bool = False,
    graph: bool | None = None,
):
    """Ingest ``text`` into ``collection`` and return the stored :class:`Document`.

    ``replace=True`` (requires ``source_id``) supersedes the previous document with the same
    (collection, source_id) in the same transaction. Ingesting text identical to a stored
    document of the same collection and source returns that document (with
    ``deduplicated = True``) instead of creating a second one. ``format`` is ``"text"`` or
    ``"markdown"``; ``chunk_size``/``chunk_overlap`` override the chunker's options.

    ``background=True`` validates now, stores the document as ``pending`` and leaves chunking
    and embedding to a Celery worker (or runs them inline when no broker is configured); the
    document moves to ``processing`` and then ``completed`` or ``failed`` (with ``error``).

    ``graph=True`` (default ``GRAPH["ENABLED"]``) also extracts entities and relationships from
    the chunks and stores them in the same transaction as the chunks.
    """
    parsed = ParsedDocument(
        text=text,
        format=format,
        content_type="text/markdown" if format == "markdown" else "text/plain",
    )
    return _ingest_parsed(
        parsed,
        collection=collection,
        title=title,
        metadata=metadata,
        source_id=source_id,
        replace=replace,
        chunker=chunker,
        embedder=embedder,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        background=background,
        graph=graph,
    )


def ingest_file(path: str | Path, **options):
    """Parse the file at ``path`` (by extension) and ingest it; options as for :func:`ingest`."""
    parsed = parse_file(path)
    return _ingest_parsed(parsed, filename=Path(path).name, **options)


def ingest_bytes(data: bytes, *, filename: str, **options):
    """Parse ``data`` as a file called ``filename`` and ingest it; nothing touches disk."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidOption(f"data must be bytes, got {type(data).__name__}")
    if not filename or not isinstance(filename, str):
        raise InvalidOption("ingest_bytes() needs a filename: it chooses the parser by extension")
    parsed = parse_bytes(bytes(data), filename=filename)
    return _ingest_parsed(parsed, filename=Path(filename).name, **options)


@dataclass
class _Pending:
    """A validated document waiting for its chunks' vectors."""

    collection: str
    document: Any  # an unsaved Document
    parsed: ParsedDocument
    replace: bool
    chunks: list[TextChunk] = field(default_factory=list)


def _validate(
    parsed: ParsedDocument,
    *,
    collection=None,
    title: str | None = "",
    metadata=None,
    source_id: str | None = None,
    replace: bool = False,
    filename: str = "",
):
    """Check one document's input; return a :class:`_Pending`, or the stored duplicate."""
    from ..models import Document

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

    # Cheap dedup before any embedding work; checked again under the lock in _write.
    existing = _find_duplicate(name, source_id, digest)
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
    return _Pending(name, document, parsed, replace)


def _commit(pending: _Pending, prepared: list[PreparedChunk], model_name: str, extractions=None):
    pending.document.chunk_count = len(prepared)
    with span(
        "vector_store.store",
        backend="PgVectorStore",
        collection=pending.collection,
        chunk_count=len(prepared),
    ):
        return _write(
            pending.collection,
            pending.document,
            prepared,
            model_name,
            replace=pending.replace,
            extractions=extractions,
        )


def _extract_graph(prepared: list[PreparedChunk]):
    """Entities and relationships of the chunks, found before the write transaction opens
    (LLM calls must not hold it)."""
    from ..conf import graph_setting
    from ..graph.builder import extract_all
    from ..graph.extractors import get_extractor

    extractions, _ = extract_all(
        [item.chunk.text for item in prepared], get_extractor(), graph_setting("CONCURRENCY")
    )
    return extractions


def _ingest_parsed(
    parsed: ParsedDocument,
    *,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    background: bool = False,
    graph: bool | None = None,
    **document_options,
):
    with span(
        "ingest",
        text=parsed.text,
        collection=document_options.get("collection"),
        source_id=document_options.get("source_id"),
        filename=document_options.get("filename", ""),
        chars=len(parsed.text) if isinstance(parsed.text, str) else None,
    ) as s:
        pending = _validate(parsed, **document_options)
        if not isinstance(pending, _Pending):
            s.set(document_id=pending.pk, chunk_count=pending.chunk_count, deduplicated=True)
            return pending
        if background:
            if chunker is not None or embedder is not None:
                raise InvalidOption(
                    "background=True uses the configured chunker and embedder (a worker "
                    "cannot receive per-call components)."
                )
            document = _enqueue(pending, {"chunk_size": chunk_size, "chunk_overlap": chunk_overlap})
            s.set(document_id=document.pk, background=True, status=document.status)
            return document
        resolved = get_embedder(embedder)
        prepared = prepare_chunks(
            pending.parsed,
            chunker=chunker,
            embedder=resolved,
            dimensions=active_dimensions(),
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
        )
        from ..conf import graph_setting

        use_graph = graph_setting("ENABLED") if graph is None else graph
        extractions = _extract_graph(prepared) if use_graph else None
        document = _commit(pending, prepared, resolved.model_name, extractions)
        s.set(
            document_id=document.pk,
            collection=pending.collection,
            chunk_count=len(prepared),
            deduplicated=False,
        )
        return document


_ITEM_KEYS = {"text", "title", "metadata", "source_id", "format"}


def ingest_many(
    documents: Iterable[str | dict],
    *,
    collection: str | None = None,
    replace: bool = False,
    format: str = "text",
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    group_size: int = 64,
) -> list:
    """Ingest many texts, embedding the chunks of several documents per batch.

    Each item is a string or a dict with ``text`` and optionally ``title``, ``metadata``,
    ``source_id`` and ``format``; the other options apply to every item as in :func:`ingest`.
    Returns the documents in input order (stored duplicates included, as with ``ingest``).

    Every item is validated and chunked before anything is embedded or written, so bad input
    raises with nothing stored (the error has a note naming ``documents[i]``). Documents are
    then embedded ``group_size`` at a time and each is written in its own transaction, in
    order: if the embedder fails, the documents of earlier groups stay stored and
    :class:`~django_rag.exceptions.EmbeddingFailed` names the document and chunk.
    """
    with span("ingest_many", collection=collection, group_size=group_size) as s:
        results = _ingest_many(
            documents,
            collection=collection,
            replace=replace,
            format=format,
            chunker=chunker,
            embedder=embedder,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            group_size=group_size,
        )
        s.set(
            document_count=len(results),
            chunk_count=sum(document.chunk_count for document in results),
        )
        return results


def _ingest_many(
    documents,
    *,
    collection,
    replace,
    format,
    chunker,
    embedder,
    chunk_size,
    chunk_overlap,
    group_size,
) -> list:
    resolved = get_embedder(embedder)
    dimensions = active_dimensions()
    results: list = []
    pending: list[tuple[int, _Pending]] = []
    for index, item in enumerate(documents):
        try:
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict) or "text" not in item or set(item) - _ITEM_KEYS:
                raise InvalidOption(
                    "each document must be a str or a dict with 'text' and optionally "
                    f"{', '.join(sorted(_ITEM_KEYS - {'text'}))}"
                )
            item_format = item.get("format", format)
            parsed = ParsedDocument(
                text=item["text"],
                format=item_format,
                content_type="text/markdown" if item_format == "markdown" else "text/plain",
            )
            validated = _validate(
                parsed,
                collection=collection,
                title=item.get("title", ""),
                metadata=item.get("metadata"),
                source_id=item.get("source_id"),
                replace=replace,
            )
            if isinstance(validated, _Pending):
                validated.chunks = chunk_text(
                    parsed,
                    chunker=chunker,
                    embedder=resolved,
                    chunk_size=chunk_size,
                    chunk_overlap=chunk_overlap,
                )
                pending.append((index, validated))
        except RagError as exc:
            exc.add_note(f"in documents[{index}]")
            raise
        results.append(validated)
    for start in range(0, len(pending), max(1, group_size)):
        group = pending[start : start + group_size]
        texts = [chunk.text for _, item in group for chunk in item.chunks]
        try:
            vectors = embed_texts(resolved, texts)
        except EmbeddingFailed as exc:
            position = exc.chunk_index
            for index, item in group:
                if position < len(item.chunks):
                    raise EmbeddingFailed(
                        f"Embedding documents[{index}] chunk {position} failed: "
                        f"{exc.__cause__}. Documents before it in earlier groups were stored; "
                        "this one and the rest were not.",
                        chunk_index=position,
                    ) from exc.__cause__
                position -= len(item.chunks)
            raise
        offset = 0
        for index, item in group:
            count = len(item.chunks)
            prepared = attach_vectors(
                item.parsed,
                item.chunks,
                vectors[offset : offset + count],
                embedder=resolved,
                dimensions=dimensions,
            )
            offset += count
            results[index] = _commit(item, prepared, resolved.model_name)
    return results


def _find_duplicate(name: str, source_id: str, digest: str):
    from ..models import Document

    return (
        Document.objects.filter(
            collection__name=name,
            source_id=source_id,
            content_hash=digest,
            status=Document.Status.COMPLETED,
        )
        .order_by("-created_at", "-id")
        .first()
    )


def _write(
    name: str,
    document,
    prepared: list[PreparedChunk],
    model_name: str,
    *,
    replace: bool,
    extractions=None,
):
    from ..graph.builder import persist, sweep_orphans
    from ..models import Collection, Document

    with transaction.atomic():
        _lock_identity(name, document)
        collection, _ = Collection.objects.get_or_create(name=name)
        existing = _find_duplicate(name, document.source_id, document.content_hash)
        if replace:
            others = Document.objects.filter(collection=collection, source_id=document.source_id)
            if existing is not None:
                others = others.exclude(pk=existing.pk)
            if others.delete()[0]:
                sweep_orphans(collection.pk)
        if existing is not None:
            existing.deduplicated = True
            return existing
        document.collection = collection
        document.save()
        _insert_chunks(document, collection, prepared, model_name)
        if extractions is not None:
            # The graph goes in with the chunks: a failure leaves neither.
            chunk_ids = list(document.chunks.order_by("chunk_index").values_list("pk", flat=True))
            persist(collection.pk, chunk_ids, extractions)
    document.deduplicated = False
    return document


def _lock_identity(name: str, document) -> None:
    """Serialise writers of one (collection, source) identity until the transaction ends:
    replace and dedup decide on committed state, so concurrent replaces end with one document."""
    identity = document.source_id or f"#{document.content_hash}"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"django_rag:document:{name}:{identity}"],
        )


def _insert_chunks(document, collection, prepared: list[PreparedChunk], model_name: str) -> None:
    from ..models import Chunk

    # Full-text vectors go in with the rows (an UPDATE afterwards would insert every chunk
    # into the HNSW index twice); triggers update the BM25 statistics in this transaction.
    vectors = search_vectors([item.chunk.text for item in prepared])
    Chunk.objects.bulk_create(
        [
            Chunk(
                document=document,
                collection=collection,
                chunk_index=item.chunk_index,
                text=item.chunk.text,
                token_count=item.chunk.token_count,
                start_char=item.chunk.start,
                end_char=item.chunk.end,
                page_start=item.page_start,
                page_end=item.page_end,
                metadata=item.chunk.metadata,
                embedding=item.embedding,
                embedding_model=model_name,
                search_vector=vector,
                fts_length=length,
            )
            for item, (vector, length) in zip(prepared, vectors, strict=True)
        ],
        batch_size=500,
    )


# --- background ingestion -------------------------------------------------------------------


def _enqueue(pending: _Pending, options: dict[str, Any]):
    """Store the document as pending and hand the chunking and embedding to a worker."""
    from ..background import enqueue
    from ..models import Collection, Job

    document = pending.document
    with transaction.atomic():
        document.collection, _ = Collection.objects.get_or_create(name=pending.collection)
        document.status = document.Status.PENDING
        document.chunk_count = 0
        document.save()
        job = Job.objects.create(
            kind="ingest",
            params={
                "document_id": document.pk,
                "replace": pending.replace,
                "format": pending.parsed.format,
                "pages": [[p.number, p.start, p.end] for p in pending.parsed.pages],
                **options,
            },
        )
    # After the commit: a worker must see the document.
    enqueue("ingest_document", job)
    document.refresh_from_db()
    document.deduplicated = False
    document.job = job
    return document


def process_pending(job) -> Any:
    """Chunk, embed and store a pending document (the body of the background ingest task).

    Idempotent: a completed document is left alone. On failure the document is marked
    ``failed`` with the error and the exception is raised (for the task's retries).
    """
    from ..models import Document
    from .parsers import Page

    params = job.params
    document = Document.objects.select_related("collection").get(pk=params["document_id"])
    if document.status == Document.Status.COMPLETED:
        return document
    Document.objects.filter(pk=document.pk).update(status=Document.Status.PROCESSING, error="")
    try:
        parsed = ParsedDocument(
            text=document.content,
            format=params.get("format", "text"),
            content_type=document.content_type,
            pages=[Page(*page) for page in params.get("pages", [])],
        )
        embedder = get_embedder()
        prepared = prepare_chunks(
            parsed,
            embedder=embedder,
            dimensions=active_dimensions(),
            chunk_size=params.get("chunk_size"),
            chunk_overlap=params.get("chunk_overlap"),
        )
        name = document.collection.name
        with transaction.atomic():
            with transaction.get_connection().cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    [
                        f"django_rag:document:{name}:{document.source_id or '#' + document.content_hash}"
                    ],
                )
            document.chunks.all().delete()  # a retried task starts clean
            _insert_chunks(document, document.collection, prepared, embedder.model_name)
            if params.get("replace") and document.source_id:
                Document.objects.filter(
                    collection=document.collection, source_id=document.source_id
                ).exclude(pk=document.pk).delete()
            document.status = Document.Status.COMPLETED
            document.chunk_count = len(prepared)
            document.save(update_fields=["status", "chunk_count", "updated_at"])
    except BaseException as exc:
        Document.objects.filter(pk=document.pk).update(
            status=Document.Status.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        raise
    return document


def delete(document) -> None:
    """Delete a document (instance or id) and its chunks."""
    from ..graph.builder import sweep_orphans
    from ..models import Document

    pk = document.pk if isinstance(document, Document) else document
    with span("delete", document_id=pk), transaction.atomic():
        collection_id = (
            Document.objects.filter(pk=pk).values_list("collection_id", flat=True).first()
        )
        deleted, _ = Document.objects.filter(pk=pk).delete()
        if deleted:
            # Entities no chunk mentions any more, in this collection only.
            sweep_orphans(collection_id)
    if not deleted:
        raise DocumentNotFound(f"No document with id {pk!r}.", id=pk)

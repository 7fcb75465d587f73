"""The ingest service: text, files and bytes become a Document with embedded chunks.

Every path (``ingest``, ``ingest_file``, ``ingest_bytes``, ``ingest_many``, background
ingestion inline or on a worker, the dashboard and the admin) does the same three things:

1. validate the input (:mod:`django_rag.validation`) and find a stored duplicate;
2. prepare: chunk, embed every chunk, extract the graph when asked (:func:`prepare_document`),
   before any write, so no transaction waits on a model or an LLM;
3. write through :func:`django_rag.store.write_document`: the document, its chunks and their
   graph in one transaction, replacing older versions with ``replace=True``.

A failure at any point leaves the database as it was.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import mimetypes
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connections

from ..background import enqueue
from ..conf import graph_setting
from ..embeddings import Embedder, active_dimensions, get_embedder
from ..exceptions import (
    DocumentNotFound,
    DocumentSuperseded,
    EmbeddingFailed,
    InvalidOption,
    RagError,
)
from ..graph.builder import extract_all
from ..graph.extractors import get_extractor
from ..graph.names import normalize_name
from ..models import Document, Job
from ..models.databases import write_db
from ..signals import span
from ..store import (
    DocumentWrite,
    delete_document,
    mark_document,
    next_versions,
    save_pending,
    touch_source,
    write_document,
    write_documents,
)
from ..store.documents import compact_on_commit, find_duplicate, find_duplicates
from ..store.uploads import discard_upload, record_parsed, save_upload, upload_of
from ..validation import (
    clean_collection_name,
    clean_filename,
    clean_metadata,
    clean_source_id,
    clean_text,
    clean_title,
)
from .chunkers import TextChunk, get_chunker
from .headers import embedding_inputs
from .isolation import parse_isolated
from .parsers import Page, ParsedDocument, check_input_size, get_parser, parse_bytes, parse_file
from .prepare import (  # noqa: F401 (prepare_chunks is re-exported: older imports use this path)
    PreparedChunk,
    attach_vectors,
    chunk_text,
    embed_texts,
    prepare_chunks,
)

logger = logging.getLogger(__name__)

FORMATS = ("text", "markdown")
# Batched ingestion folds the BM25 statistics deltas about this often (in chunks).
COMPACT_EVERY = 2048
ON_CHUNK_ERROR = ("raise", "skip")
ON_ERROR = ("raise", "skip")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- one document: validate, prepare, store ------------------------------------------------


@dataclass
class _Pending:
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


def _text_document(text: Any, format: Any) -> ParsedDocument:
    if format not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    return ParsedDocument(
        text=text,
        format=format,
        content_type="text/markdown" if format == "markdown" else "text/plain",
    )


def _validate(
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
    """Check one document's input; return a :class:`_Pending`, or the stored duplicate
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
    return _Pending(name, document, parsed, replace)


def _take_versions(validated: Sequence[_Pending]) -> None:
    """Give submitted documents their versions (one statement), before anything is embedded or
    queued: the order of versions is the order of the calls, whatever runs them later."""
    for item, version in zip(validated, next_versions(len(validated)), strict=True):
        item.document.version = version


def _use_graph(graph: bool | None) -> bool:
    return bool(graph_setting("ENABLED") if graph is None else graph)


def _extract_graph(chunks: Sequence[PreparedChunk], collection: str) -> list:
    """Entities and relationships of the chunks, found before the write transaction opens
    (LLM calls must not hold it), in a ``graph.build`` span as a :func:`build_graph` run emits
    (``ingest=True``; its counts are those found in this document's chunks)."""
    with span("graph.build", collection=collection, resume=True, ingest=True) as s:
        extractions, failed = extract_all(
            [item.chunk.text for item in chunks], get_extractor(), graph_setting("CONCURRENCY")
        )
        entities = {normalize_name(e.name) for x in extractions for e in x.entities}
        relationships = {
            (normalize_name(r.source), normalize_name(r.target), r.type)
            for x in extractions
            for r in x.relationships
        }
        s.set(
            chunks=len(chunks),
            failed=failed,
            entities=len(entities - {""}),
            relationships=len(relationships),
        )
    return extractions


def prepare_document(
    pending: _Pending,
    *,
    embedder: Embedder,
    chunker=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    graph: bool = False,
    on_chunk_error: str = "raise",
    progress: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Chunk and embed a validated document (and extract its graph): no database writes.
    ``progress(done, total)`` follows the embedding, chunk by chunk (a job's report)."""
    chunks = pending.chunks or chunk_text(
        pending.parsed,
        chunker=chunker,
        embedder=embedder,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        title=pending.document.title,
    )
    vectors = embed_texts(
        embedder, embedding_inputs(chunks), on_error=on_chunk_error, progress=progress
    )
    return _prepared(pending, chunks, vectors, embedder, graph)


def _prepared(pending: _Pending, chunks, vectors, embedder: Embedder, graph: bool) -> Prepared:
    prepared = attach_vectors(
        pending.parsed, chunks, vectors, embedder=embedder, dimensions=active_dimensions()
    )
    skipped = [index for index, vector in enumerate(vectors) if vector is None]
    return Prepared(
        prepared,
        _extract_graph(prepared, pending.collection) if graph else None,
        embedder.model_name,
        skipped,
    )


def _store(pending: _Pending, prepared: Prepared) -> Document:
    """Write a prepared document through the store (the one write path)."""
    # A retried background task's document still holds the failed attempt's error.
    pending.document.error = (
        f"{len(prepared.skipped)} chunk(s) could not be embedded and were skipped: "
        f"{prepared.skipped[:50]}"
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
        return _superseded(pending, exc)
    document.superseded = False
    document.skipped_chunks = prepared.skipped
    return document


def _superseded(pending: _Pending, exc: DocumentSuperseded) -> Document:
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
    on_chunk_error: str = "raise",
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
    the chunks and stores them in the same transaction as the chunks, on every path.

    ``on_chunk_error="skip"`` stores the chunks that embed when the provider refuses some (the
    skipped indexes are in ``document.skipped_chunks`` and ``document.error``); the default
    ``"raise"`` stores nothing.
    """
    return _ingest_parsed(
        _text_document(text, format),
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
        on_chunk_error=on_chunk_error,
    )


def ingest_file(path: str | Path, **options):
    """Parse the file at ``path`` (by extension) and ingest it; options as for :func:`ingest`."""
    clean_filename(str(path))
    parsed = parse_file(path)
    return _ingest_parsed(parsed, filename=Path(path).name, **options)


def ingest_bytes(data: bytes, *, filename: str, background: bool = False, **options):
    """Parse ``data`` as a file called ``filename`` and ingest it; nothing touches disk.

    With ``background=True`` the bytes are not parsed here: they are stored with the pending
    document, and the job parses them (in a child process limited to ``MAX_PARSE_MEMORY``),
    then chunks and embeds. Only cheap checks run now (the options, the file type, its size);
    a file the parser refuses leaves the document and the job ``failed`` with the typed
    error's message. This is how the dashboard ingests uploads: the web process never holds
    what parsing a hostile file would take.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidOption(f"data must be bytes, got {type(data).__name__}")
    clean_filename(filename)
    if background:
        return _ingest_upload(bytes(data), filename=filename, **options)
    parsed = parse_bytes(bytes(data), filename=filename)
    return _ingest_parsed(parsed, filename=Path(filename).name, **options)


def _ingest_upload(
    data: bytes,
    *,
    filename: str,
    collection=None,
    title: str | None = "",
    metadata=None,
    source_id: str | None = None,
    replace: bool = False,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    graph: bool | None = None,
    on_chunk_error: str = "raise",
) -> Document:
    """Validate an upload's options, store its bytes with a pending document and queue the job
    that parses, chunks and embeds it."""
    if on_chunk_error not in ON_CHUNK_ERROR:
        raise InvalidOption(
            f"on_chunk_error must be one of {', '.join(ON_CHUNK_ERROR)}, got {on_chunk_error!r}"
        )
    if chunker is not None or embedder is not None:
        raise InvalidOption(
            "background=True uses the configured chunker and embedder (a worker cannot "
            "receive per-call components)."
        )
    parser = get_parser(filename)  # an unsupported type is refused now, unread
    check_input_size(parser, len(data), filename=filename)
    source_id = clean_source_id(source_id)
    title = clean_title(title)
    if replace and not source_id:
        raise InvalidOption(
            "replace=True needs a source_id: it replaces the document with the same "
            "(collection, source_id)."
        )
    metadata = clean_metadata(metadata)
    name = clean_collection_name(collection)
    basename = Path(filename).name
    with span("ingest", collection=name, source_id=source_id, filename=basename) as s:
        document = Document(
            source_id=source_id,
            title=(title or "")[:500],
            content="",  # the job parses the upload
            content_hash="",
            metadata=metadata,
            original_filename=basename[:500],
            content_type=mimetypes.guess_type(basename)[0] or parser.content_type,
        )
        (document.version,) = next_versions(1)  # submitted now, whenever the job runs
        document = save_upload(document, name, filename=filename, data=data)
        job = Job.objects.create(
            kind=Job.Kind.INGEST,
            params={
                "document_id": document.pk,
                "collection": name,
                "title": document.title or basename,
                "replace": replace,
                "upload": True,
                "chunk_size": chunk_size,
                "chunk_overlap": chunk_overlap,
                "graph": _use_graph(graph),
                "on_chunk_error": on_chunk_error,
            },
        )
        document = _queue(document, job)
        s.set(document_id=document.pk, background=True, status=document.status)
        return document


def _ingest_parsed(
    parsed: ParsedDocument,
    *,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    background: bool = False,
    graph: bool | None = None,
    on_chunk_error: str = "raise",
    **document_options,
):
    if on_chunk_error not in ON_CHUNK_ERROR:
        raise InvalidOption(
            f"on_chunk_error must be one of {', '.join(ON_CHUNK_ERROR)}, got {on_chunk_error!r}"
        )
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
        _take_versions([pending])
        use_graph = _use_graph(graph)
        if background:
            if chunker is not None or embedder is not None:
                raise InvalidOption(
                    "background=True uses the configured chunker and embedder (a worker "
                    "cannot receive per-call components)."
                )
            document = _enqueue(
                pending,
                {
                    "chunk_size": chunk_size,
                    "chunk_overlap": chunk_overlap,
                    "graph": use_graph,
                    "on_chunk_error": on_chunk_error,
                },
            )
            s.set(document_id=document.pk, background=True, status=document.status)
            return document
        resolved = get_embedder(embedder)
        prepared = prepare_document(
            pending,
            embedder=resolved,
            chunker=chunker,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            graph=use_graph,
            on_chunk_error=on_chunk_error,
        )
        document = _store(pending, prepared)
        s.set(
            document_id=document.pk,
            collection=pending.collection,
            chunk_count=len(prepared.chunks),
            deduplicated=document.deduplicated,
        )
        return document


def ingest_source(
    text: str,
    *,
    collection: str,
    source_id: str,
    version: int,
    title: str = "",
    metadata: dict | None = None,
    format: str = "text",
) -> Document:
    """Replace ``(collection, source_id)`` with ``text`` at ``version``, a version taken earlier
    (:func:`~django_rag.store.next_versions`) when the change was made: model sync takes it as
    the row's change commits, so the order of changes decides what stays, not the order the
    jobs run in. Returns the stored document (``superseded`` when a newer version won)."""
    pending = _validate(
        _text_document(text, format),
        collection=collection,
        title=title,
        metadata=metadata,
        source_id=source_id,
        replace=True,
        check_duplicate=False,
    )
    pending.document.version = version
    prepared = prepare_document(pending, embedder=get_embedder(), graph=_use_graph(None))
    return _store(pending, prepared)


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
    graph: bool | None = None,
    on_error: str = "skip",
) -> list:
    """Ingest many texts, embedding the chunks of several documents per batch.

    Each item is a string or a dict with ``text`` and optionally ``title``, ``metadata``,
    ``source_id`` and ``format``; the other options apply to every item as in :func:`ingest`.
    Returns the documents in input order (stored duplicates included, as with ``ingest``).

    One bad document does not fail the batch: with ``on_error="skip"`` (the default, as for
    :func:`ingest_files` and ``rag_ingest``) a document that cannot be ingested (empty text,
    bad metadata or source id, a chunk the embedder refuses, a failed write) is skipped and its
    exception (a :class:`~django_rag.exceptions.RagError` with a note naming ``documents[i]``)
    takes its place in the result; the others are stored. Options wrong for every document
    (``collection``, ``format``, ``chunk_size``...) still raise before anything is stored.

    With ``on_error="raise"`` every item is validated and chunked before anything is embedded
    or written, so bad input raises with nothing stored (the error has a note naming
    ``documents[i]``); if the embedder fails, the documents of earlier groups stay stored and
    :class:`~django_rag.exceptions.EmbeddingFailed` names the document and chunk; if a group's
    write fails, the error is raised: earlier groups stay stored, and so do the earlier runs of
    the failing group when it was cut at a repeated source_id.

    Stored duplicates are found in one query. Documents are embedded ``group_size`` at a time
    (the next group on a thread while the previous one is written) and each group is written
    in one transaction, in order (cut where a source_id comes back, so the result is that of
    one ``ingest`` per document).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidOption(f"group_size must be a positive integer, got {group_size!r}")
    if on_error not in ON_ERROR:
        raise InvalidOption(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
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
            graph=_use_graph(graph),
            on_error=on_error,
        )
        failed = sum(isinstance(document, Exception) for document in results)
        if failed:
            logger.warning("ingest_many: %d of %d document(s) skipped", failed, len(results))
        s.set(
            document_count=len(results) - failed,
            failed=failed,
            chunk_count=sum(getattr(document, "chunk_count", 0) for document in results),
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
    graph,
    on_error,
) -> list:
    # Options shared by every document fail the call, not each document.
    collection = clean_collection_name(collection)
    if format not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    options = {
        key: value
        for key, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap))
        if value is not None
    }
    get_chunker(chunker, **options)
    resolved = get_embedder(embedder)
    errors: dict[int, Exception] | None = {} if on_error == "skip" else None
    results: list = []
    validated: list[tuple[int, _Pending]] = []
    for index, item in enumerate(documents):
        try:
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict) or "text" not in item or set(item) - _ITEM_KEYS:
                raise InvalidOption(
                    "each document must be a str or a dict with 'text' and optionally "
                    f"{', '.join(sorted(_ITEM_KEYS - {'text'}))}"
                )
            parsed = _text_document(item["text"], item.get("format", format))
            checked = _validate(
                parsed,
                collection=collection,
                title=item.get("title", ""),
                metadata=item.get("metadata"),
                source_id=item.get("source_id"),
                replace=replace,
                check_duplicate=False,
            )
        except RagError as exc:
            exc.add_note(f"in documents[{index}]")
            if errors is None:
                raise
            errors[index] = exc
            results.append(exc)
            continue
        validated.append((index, checked))
        results.append(checked)
    _take_versions([item for _, item in validated])
    to_write = _without_stored(validated, results, replace)
    _write_batched(
        to_write,
        results,
        embedder=resolved,
        chunker=chunker,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        group_size=group_size,
        graph=graph,
        errors=errors,
    )
    for index, error in (errors or {}).items():
        if not any(note.startswith("in documents[") for note in getattr(error, "__notes__", [])):
            error.add_note(f"in documents[{index}]")
        results[index] = error
    return results


def _without_stored(validated: list[tuple[int, _Pending]], results: list, replace: bool) -> list:
    """Cheap dedup before any embedding work, one query per thousand documents (the store
    checks again under the identity locks): a stored duplicate goes to ``results[index]``,
    the others are returned. With ``replace``, only a duplicate that is its identity's only
    document counts (one more query)."""
    stored: dict = {}
    if validated:
        name = validated[0][1].collection
        identities = [(p.document.source_id, p.document.content_hash) for _, p in validated]
        for start in range(0, len(identities), 1000):
            stored.update(find_duplicates(name, identities[start : start + 1000]))
    if replace and stored:
        # A replace whose text is already its identity's only document has nothing to replace:
        # it is not embedded again (re-running rag_ingest on unchanged files costs no model
        # time). Where other versions are stored, the write goes on and deletes them.
        sources = sorted({source for source, _ in stored})
        versions = Counter(
            Document.objects.using(write_db())
            .filter(collection__name=validated[0][1].collection, source_id__in=sources)
            .values_list("source_id", flat=True)
        )
        stored = {key: document for key, document in stored.items() if versions[key[0]] == 1}
    left = []
    for index, item in validated:
        existing = stored.get((item.document.source_id, item.document.content_hash))
        if existing is not None:
            existing.deduplicated = True
            results[index] = existing
        else:
            left.append((index, item))
    return left


def _write_batched(
    items: list[tuple[int, _Pending]],
    results: list,
    *,
    embedder: Embedder,
    chunker,
    chunk_size,
    chunk_overlap,
    group_size: int,
    graph: bool,
    errors: dict[int, Exception] | None = None,
    progress=None,
) -> None:
    """Chunk, embed and write validated documents ``group_size`` at a time; ``results[index]``
    becomes each one's stored document.

    Without ``errors`` the first failure raises (with a note naming ``documents[index]``);
    with it, a document's failure is recorded there and the others go on (a group whose
    embedding fails is embedded again document by document). ``progress(done, total)`` is
    called with chunk counts as batches are embedded (from the embedding thread)."""
    pending: list[tuple[int, _Pending]] = []
    for index, item in items:
        try:
            item.chunks = chunk_text(
                item.parsed,
                chunker=chunker,
                embedder=embedder,
                chunk_size=chunk_size,
                chunk_overlap=chunk_overlap,
                title=item.document.title,
            )
        except RagError as exc:
            if errors is None:
                exc.add_note(f"in documents[{index}]")
                raise
            errors[index] = exc
            continue
        pending.append((index, item))
    groups = [pending[start : start + group_size] for start in range(0, len(pending), group_size)]
    if not groups:
        return
    total = sum(len(item.chunks) for _, item in pending)
    done = 0

    def embed(group) -> list:
        texts = [text for _, item in group for text in embedding_inputs(item.chunks)]
        before = done  # groups are embedded one after another

        def advance(count: int, _of: int) -> None:
            nonlocal done
            done = before + count
            progress(done, total)

        try:
            return embed_texts(embedder, texts, progress=advance if progress else None)
        finally:
            # A progress callback (a job's report) may have used the database on this thread.
            connections.close_all()

    # The statistics deltas are folded every COMPACT_EVERY chunks and at the end (even after a
    # failure), not after every group.
    since_compaction = 0
    try:
        # The next group is embedded on a thread while this one is written: the model and the
        # database work at the same time (the model releases the GIL while it computes).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="django_rag-embed") as pool:
            future = pool.submit(contextvars.copy_context().run, embed, groups[0])
            for number, group in enumerate(groups):
                try:
                    vectors = future.result()
                except EmbeddingFailed as exc:
                    if errors is None:
                        raise _group_failure(exc, group) from exc.__cause__
                    vectors = None
                if number + 1 < len(groups):
                    future = pool.submit(contextvars.copy_context().run, embed, groups[number + 1])
                writes, written_indexes, offset = [], [], 0
                for index, item in group:
                    count = len(item.chunks)
                    try:
                        if vectors is None:  # the group failed: find which document did
                            own = embed_texts(embedder, embedding_inputs(item.chunks))
                        else:
                            own = vectors[offset : offset + count]
                        prepared = _prepared(item, item.chunks, own, embedder, graph)
                    except RagError as exc:
                        if errors is None:
                            exc.add_note(f"in documents[{index}]")
                            raise
                        errors[index] = exc
                        continue
                    finally:
                        offset += count
                    item.document.error = ""
                    writes.append(
                        DocumentWrite(
                            item.document,
                            [chunk.row() for chunk in prepared.chunks],
                            replace=item.replace,
                            extractions=prepared.extractions,
                        )
                    )
                    written_indexes.append(index)
                if not writes:
                    continue
                written = _write_group(
                    writes,
                    written_indexes,
                    errors,
                    collection=group[0][1].collection,
                    model_name=embedder.model_name,
                )
                since_compaction += sum(len(write.chunks) for write in writes)
                if since_compaction >= COMPACT_EVERY:
                    compact_on_commit()
                    since_compaction = 0
                for index, document in zip(written_indexes, written, strict=True):
                    if document is None:  # its write failed: recorded in ``errors``
                        continue
                    if isinstance(document, DocumentSuperseded):  # a newer version won
                        results[index] = _superseded(dict(group)[index], document)
                        continue
                    document.skipped_chunks = []
                    results[index] = document
    finally:
        if since_compaction:
            try:
                compact_on_commit()
            except Exception:  # the deltas stay for the next compaction; keep the real error
                logger.exception("folding the statistics deltas after a batched ingest failed")


def _write_group(
    writes: list[DocumentWrite],
    indexes: list[int],
    errors: dict[int, Exception] | None,
    *,
    collection: str,
    model_name: str,
) -> list[Document | None]:
    """Write a group in one transaction. When recording ``errors`` (one file's failure must not
    stop the others) and the group's write fails, its documents are written one by one, so only
    the failing ones are lost; each failure is recorded under its index (None in the result)."""
    try:
        return write_documents(writes, collection=collection, model_name=model_name, compact=False)
    except (RagError, DatabaseError):
        if errors is None or connections[write_db()].in_atomic_block:
            raise
    written: list[Document | None] = []
    for index, write in zip(indexes, writes, strict=True):
        write.document.pk = None  # the failed attempt's keys were rolled back
        write.document._state.adding = True
        try:
            (document,) = write_documents(
                [write], collection=collection, model_name=model_name, compact=False
            )
        except (RagError, DatabaseError) as exc:
            errors[index] = exc
            document = None
        written.append(document)
    return written


def _group_failure(exc: EmbeddingFailed, group) -> EmbeddingFailed:
    """The embedder's failure in a group, naming the document and its chunk."""
    position = exc.chunk_index
    for index, item in group:
        if position < len(item.chunks):
            return EmbeddingFailed(
                f"Embedding documents[{index}] chunk {position} failed: "
                f"{exc.__cause__}. Documents before it in earlier groups were stored; "
                "this one and the rest were not.",
                chunk_index=position,
            )
        position -= len(item.chunks)
    return exc


def ingest_files(
    paths: Iterable[str | Path],
    *,
    collection: str | None = None,
    source_ids: Sequence[str] | None = None,
    replace: bool = False,
    title: str = "",
    metadata: dict | None = None,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    group_size: int = 64,
    graph: bool | None = None,
    progress=None,
) -> list:
    """Ingest many files through the batched path of :func:`ingest_many` (what ``rag_ingest``
    runs): parsed one by one, stored duplicates found in one query, chunks of several files
    embedded per batch, each group written in one transaction.

    One file's failure does not stop the others: the result has, for each path in order, the
    stored :class:`Document` (``deduplicated`` as with ``ingest``) or the exception
    (:class:`~django_rag.exceptions.RagError` or ``OSError``) that file raised. Options that are
    wrong for every file (``collection``, ``metadata``, ``chunk_size``...) raise at once.
    ``source_ids`` defaults to each path as given. ``progress(done, total)`` receives chunk
    counts while embedding runs (from the embedding thread).

    With ``replace=True``, a file whose text equals its identity's only stored document is not
    embedded again: that document comes back with ``deduplicated = True``.
    """
    paths = [Path(path) for path in paths]
    if source_ids is not None and len(source_ids) != len(paths):
        raise InvalidOption(f"{len(source_ids)} source_ids for {len(paths)} paths")
    name, resolved = _check_file_options(
        collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
    )
    parsed: list[ParsedDocument | Exception] = []
    for path in paths:
        try:
            clean_filename(str(path))
            parsed.append(parse_file(path))
        except (RagError, OSError) as exc:
            parsed.append(exc)
    return ingest_parsed_files(
        paths,
        parsed,
        collection=name,
        source_ids=source_ids,
        replace=replace,
        title=title,
        metadata=metadata,
        chunker=chunker,
        embedder=resolved,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        group_size=group_size,
        graph=graph,
        progress=progress,
    )


def _check_file_options(
    collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
) -> tuple[str, Embedder]:
    """Options shared by every file, checked once, before any file is read."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidOption(f"group_size must be a positive integer, got {group_size!r}")
    name = clean_collection_name(collection)
    clean_title(title)
    clean_metadata(metadata)
    options = {
        key: value
        for key, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap))
        if value is not None
    }
    get_chunker(chunker, **options)
    return name, get_embedder(embedder)


def ingest_parsed_files(
    paths: Sequence[Path],
    parsed: Sequence[ParsedDocument | Exception],
    *,
    collection: str | None = None,
    source_ids: Sequence[str] | None = None,
    replace: bool = False,
    title: str = "",
    metadata: dict | None = None,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    group_size: int = 64,
    graph: bool | None = None,
    progress=None,
) -> list:
    """:func:`ingest_files` for files already parsed (``parsed[i]`` is ``paths[i]``'s
    document, or the exception its parsing raised, returned as is): what
    :func:`~django_rag.ingestion.folders.sync_folder` runs after comparing hashes."""
    name, resolved = _check_file_options(
        collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
    )
    with span("ingest_files", collection=name, file_count=len(paths)) as s:
        results: list = [None] * len(paths)
        errors: dict[int, Exception] = {}
        validated: list[tuple[int, _Pending]] = []
        for index, (path, document) in enumerate(zip(paths, parsed, strict=True)):
            if isinstance(document, Exception):
                errors[index] = document
                continue
            try:
                validated.append(
                    (
                        index,
                        _validate(
                            document,
                            collection=name,
                            title=title,
                            metadata=metadata,
                            source_id=source_ids[index] if source_ids is not None else str(path),
                            replace=replace,
                            filename=path.name,
                            check_duplicate=False,
                        ),
                    )
                )
            except (RagError, OSError) as exc:
                errors[index] = exc
        _take_versions([item for _, item in validated])
        _write_batched(
            _without_stored(validated, results, replace),
            results,
            embedder=resolved,
            chunker=chunker,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            group_size=group_size,
            graph=_use_graph(graph),
            errors=errors,
            progress=progress,
        )
        for index, error in errors.items():
            results[index] = error
        s.set(document_count=sum(isinstance(r, Document) for r in results), failed=len(errors))
        return results


# --- background ingestion -------------------------------------------------------------------


def _enqueue(pending: _Pending, options: dict[str, Any]) -> Document:
    """Store the document as pending and hand the chunking and embedding to a worker.

    When the task cannot be sent (the broker is down), the pending document is removed again
    and :class:`~django_rag.exceptions.BackgroundUnavailable` raised: nothing is left waiting
    for a worker that will never come.
    """
    document = save_pending(pending.document, pending.collection)
    job = Job.objects.create(
        kind=Job.Kind.INGEST,
        params={
            "document_id": document.pk,
            # For the jobs page: which collection (its access scope) and which document.
            "collection": pending.collection,
            "title": document.title or document.original_filename or "",
            "source_id": document.source_id,
            "version": document.version,
            "replace": pending.replace,
            "format": pending.parsed.format,
            "pages": [[p.number, p.start, p.end] for p in pending.parsed.pages],
            **options,
        },
    )
    return _queue(document, job)


def _queue(document: Document, job: Job) -> Document:
    enqueue("ingest_document", job, on_failure=lambda: delete_document(document.pk))
    try:
        document.refresh_from_db()
        document.deduplicated = False
    except Document.DoesNotExist:
        # An inline job found the upload's text stored already and dropped the pending copy:
        # the stored document is the result (as a foreground ingest deduplicates).
        job.refresh_from_db()
        stored = Document.objects.using(write_db()).filter(pk=job.result.get("document_id"))
        document = stored.first()
        if document is None:
            raise
        document.deduplicated = True
    document.job = job
    return document


def process_pending(job: Job) -> Document:
    """Chunk, embed and store a pending document (the body of the background ingest task).

    The same preparation and store write as a foreground ingest, graph included. Idempotent:
    a completed document is left alone. On failure the document is marked ``failed`` with the
    error and the exception is raised (for the task's retries).
    """
    params = job.params
    # On the write database: the pending row may not have reached a replica yet.
    document = (
        Document.objects.using(write_db())
        .select_related("collection")
        .filter(pk=params["document_id"])
        .first()
    )
    if document is None:  # a newer version's replace (or a delete) removed it while it waited
        raise DocumentSuperseded(
            params.get("collection", ""), params.get("source_id", ""), params.get("version", 0)
        )
    if document.status == Document.Status.COMPLETED:
        return document
    mark_document(document.pk, Document.Status.PROCESSING)
    try:
        replace = bool(params.get("replace"))
        if params.get("upload"):
            parsed = _parse_upload(document)
            # The same text stored already: that document is the result, with or without
            # replace (a second identical copy would only be deleted by the next replace).
            duplicate = _stored_copy(document, replace)
            if duplicate is not None:
                return duplicate
        else:
            parsed = ParsedDocument(
                text=document.content,
                format=params.get("format", "text"),
                content_type=document.content_type,
                pages=[Page(*page) for page in params.get("pages", [])],
            )
        pending = _Pending(document.collection.name, document, parsed, replace)
        prepared = prepare_document(
            pending,
            embedder=get_embedder(),
            chunk_size=params.get("chunk_size"),
            chunk_overlap=params.get("chunk_overlap"),
            graph=bool(params.get("graph")),
            on_chunk_error=params.get("on_chunk_error", "raise"),
            progress=job.report,  # the jobs page shows chunks embedded / chunks
        )
        stored = _store(pending, prepared)
        if params.get("upload"):
            discard_upload(document.pk)
        return stored
    except DocumentSuperseded:
        raise  # its pending row is gone with it
    except BaseException as exc:
        mark_document(document.pk, Document.Status.FAILED, f"{type(exc).__name__}: {exc}")
        raise


def _parse_upload(document: Document) -> ParsedDocument:
    """Parse a pending document's upload where memory is bounded (a child process limited to
    ``MAX_PARSE_MEMORY``), validate the text and record it on the document."""
    upload = upload_of(document.pk)
    if upload is None:
        raise DocumentNotFound(
            f"The upload of document {document.pk} is gone (it was stored already, or "
            "deleted): upload the file again.",
            id=document.pk,
        )
    parsed = parse_isolated(bytes(upload.data), filename=upload.filename)
    text = clean_text(parsed.text)
    parsed.text = text
    record_parsed(
        document,
        content=text,
        content_hash=content_hash(text),
        title=(document.title or parsed.title or "")[:500],
        metadata={**parsed.metadata, **document.metadata},
        content_type=parsed.content_type or document.content_type,
    )
    return parsed


def _stored_copy(document: Document, replace: bool) -> Document | None:
    """A completed document of the same identity with the same text: the pending upload is
    dropped and that one returned (as ``ingest`` deduplicates). With ``replace`` the upload's
    version still counts: older versions queued before it are superseded."""
    name = document.collection.name
    existing = find_duplicate(name, document.source_id, document.content_hash)
    if existing is None:
        return None
    if replace and touch_source(name, document.source_id, document.version) is None:
        delete_document(document.pk)  # a newer version was stored first
        raise DocumentSuperseded(name, document.source_id, document.version)
    delete_document(document.pk)
    existing.deduplicated = True
    return existing


def abandon_pending(job: Job, error: str) -> None:
    """The document of an ingest job failed for its task (its process died mid-job): marked
    ``failed`` with ``error`` rather than left ``processing`` with no runner (a completed one
    stays completed). A retry of the job processes it again."""
    document_id = job.params.get("document_id")
    if document_id is not None:
        mark_document(document_id, Document.Status.FAILED, error)


def delete(document) -> None:
    """Delete a document (instance or id), its chunks and the graph entities only it
    mentioned."""
    pk = document.pk if isinstance(document, Document) else document
    if isinstance(pk, str) and pk.isascii() and pk.strip().isdigit():
        pk = int(pk)
    if isinstance(pk, bool) or not isinstance(pk, int) or not 0 < pk < 2**63:
        # Not an id at all ("abc", None, 1.5): no document has it.
        raise DocumentNotFound(
            f"No document with id {pk!r}: document ids are positive integers.", id=pk
        )
    with span("delete", document_id=pk):
        deleted = delete_document(pk)
    if not deleted:
        raise DocumentNotFound(f"No document with id {pk!r}.", id=pk)

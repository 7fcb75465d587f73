"""The ingest service: text, files and bytes become a Document with embedded chunks.

Every path (``ingest``, ``ingest_file``, ``ingest_bytes``, ``ingest_many``, background
ingestion inline or on a worker, the dashboard and the admin) does the same three things,
written once in :mod:`~django_rag.ingestion.pipeline`:

1. validate the input (:mod:`django_rag.validation`) and find a stored duplicate;
2. prepare: chunk, embed every chunk, extract the graph when asked (:func:`prepare_document`),
   before any write, so no transaction waits on a model or an LLM;
3. write through :func:`django_rag.store.write_document`: the document, its chunks and their
   graph in one transaction, replacing older versions with ``replace=True``.

A failure at any point leaves the database as it was. This module holds the one-document entry
points and ``delete``; batches are in :mod:`~django_rag.ingestion.batch` (``ingest_many``) and
:mod:`~django_rag.ingestion.files` (``ingest_files``), background ingestion in
:mod:`~django_rag.ingestion.queued`. Their public names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..embeddings import get_embedder
from ..exceptions import DocumentNotFound, InvalidOption
from ..models import Document
from ..signals import span
from ..store import delete_document
from ..validation import clean_filename
from .batch import ingest_many  # noqa: F401 (re-exported: callers import it from here)
from .collections import apply_description, resolve_ingest_collection
from .files import ingest_files, ingest_parsed_files  # noqa: F401 (re-exported)
from .graphs import refuse_background_extractors, use_graph
from .isolation import parse_file_isolated, parse_isolated
from .parsers import ParsedDocument
from .pipeline import (  # noqa: F401 (FORMATS, content_hash, Prepared are re-exported)
    FORMATS,
    ON_CHUNK_ERROR,
    Pending,
    Prepared,
    content_hash,
    prepare_document,
    store_prepared,
    take_versions,
    text_document,
    validate,
)
from .prepare import prepare_chunks  # noqa: F401 (re-exported: older imports use this path)
from .queued import (  # noqa: F401 (abandon_pending, process_pending are re-exported)
    abandon_pending,
    enqueue_document,
    ingest_upload,
    process_pending,
)

# --- public entry points ----------------------------------------------------------------------


def ingest(
    text: str,
    *,
    collection: str | Mapping[str, str] | None = None,
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
    strict_collections: bool | None = None,
    extractor=None,
    entity_extractor=None,
    relationship_extractor=None,
) -> Document:
    """Ingest ``text`` into ``collection`` and return the stored :class:`Document`.

    ``collection`` is a name or ``{"name": ..., "description": ...}``: the description is
    stored on the collection (created with it; an existing collection's empty description is
    filled, a non-empty one kept). ``strict_collections=True`` (default
    ``STRICT_COLLECTIONS``) never creates a collection: an unknown one raises
    :class:`~django_rag.exceptions.UnknownCollection` before anything is written.

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
    ``extractor=`` (or ``entity_extractor=`` / ``relationship_extractor=``) extracts with
    this call's own extractor (any ``GRAPH["EXTRACTOR"]`` form: an alias, a dotted path, an
    instance, a function) and turns the graph on; not with ``background=True``.

    ``on_chunk_error="skip"`` stores the chunks that embed when the provider refuses some (the
    skipped indexes are in ``document.skipped_chunks`` and ``document.error``); the default
    ``"raise"`` stores nothing.
    """
    return _ingest_parsed(
        text_document(text, format),
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
        strict_collections=strict_collections,
        extractor=extractor,
        entity_extractor=entity_extractor,
        relationship_extractor=relationship_extractor,
    )


def ingest_file(path: str | Path, **options) -> Document:
    """Parse the file at ``path`` (by extension) and ingest it; options as for :func:`ingest`.
    The parse runs in a bounded worker (``MAX_PARSE_MEMORY``, ``PARSE_TIMEOUT``)."""
    clean_filename(str(path))
    parsed = parse_file_isolated(path)
    return _ingest_parsed(parsed, filename=Path(path).name, **options)


def ingest_bytes(data: bytes, *, filename: str, background: bool = False, **options) -> Document:
    """Parse ``data`` as a file called ``filename`` and ingest it; nothing touches disk. The
    parse runs in a bounded worker (``MAX_PARSE_MEMORY``, ``PARSE_TIMEOUT``), as every parse.

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
        return ingest_upload(bytes(data), filename=filename, **options)
    parsed = parse_isolated(bytes(data), filename=filename)
    return _ingest_parsed(parsed, filename=Path(filename).name, **options)


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
    strict_collections: bool | None = None,
    extractor=None,
    entity_extractor=None,
    relationship_extractor=None,
    **document_options,
):
    if on_chunk_error not in ON_CHUNK_ERROR:
        raise InvalidOption(
            f"on_chunk_error must be one of {', '.join(ON_CHUNK_ERROR)}, got {on_chunk_error!r}"
        )
    if background:
        refuse_background_extractors(extractor, entity_extractor, relationship_extractor)
    with_graph = use_graph(graph, extractor, entity_extractor, relationship_extractor)
    name, description = resolve_ingest_collection(
        document_options.get("collection"), strict_collections
    )
    document_options["collection"] = name
    with span(
        "ingest",
        text=parsed.text,
        collection=document_options.get("collection"),
        source_id=document_options.get("source_id"),
        filename=document_options.get("filename", ""),
        chars=len(parsed.text) if isinstance(parsed.text, str) else None,
    ) as s:
        pending = validate(parsed, **document_options)
        apply_description(name, description)  # once the document is valid
        if not isinstance(pending, Pending):
            s.set(document_id=pending.pk, chunk_count=pending.chunk_count, deduplicated=True)
            return pending
        take_versions([pending])
        if background:
            if chunker is not None or embedder is not None:
                raise InvalidOption(
                    "background=True uses the configured chunker and embedder (a worker "
                    "cannot receive per-call components)."
                )
            document = enqueue_document(
                pending,
                {
                    "chunk_size": chunk_size,
                    "chunk_overlap": chunk_overlap,
                    "graph": bool(with_graph),
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
            graph=with_graph,
            on_chunk_error=on_chunk_error,
        )
        document = store_prepared(pending, prepared)
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
    pending = validate(
        text_document(text, format),
        collection=collection,
        title=title,
        metadata=metadata,
        source_id=source_id,
        replace=True,
        check_duplicate=False,
    )
    pending.document.version = version
    prepared = prepare_document(pending, embedder=get_embedder(), graph=use_graph(None))
    return store_prepared(pending, prepared)


def delete(document: Document | int | str) -> None:
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

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

from pathlib import Path
from typing import Any, Unpack

from ..exceptions import DocumentNotFound, InvalidOption
from ..models import Document
from ..signals import span
from ..store import delete_document
from ..validation import clean_filename, rejects_unknown_options
from .batch import ingest_many  # noqa: F401 (re-exported: callers import it from here)
from .collections import apply_description
from .files import ingest_files, ingest_parsed_files  # noqa: F401 (re-exported)
from .isolation import parse_file_isolated, parse_isolated
from .parsers import ParsedDocument
from .pipeline import (  # noqa: F401 (FORMATS, content_hash, Prepared are re-exported)
    FORMATS,
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
from .request import IngestOptions, IngestRequest, build_ingest_request

# --- public entry points ----------------------------------------------------------------------


def ingest(text: str, **options: Unpack[IngestOptions]) -> Document:
    """Ingest ``text`` into ``collection`` and return the stored :class:`Document`.

    ``collection`` is a name or ``{"name": ..., "description": ...}``: the description is
    stored on the collection (created with it; an existing collection's empty description is
    filled, a non-empty one kept). ``strict_collections=True`` (default
    ``STRICT_COLLECTIONS``) never creates a collection: an unknown one raises
    :class:`~django_rag.exceptions.UnknownCollection` before anything is written.

    ``replace=True`` (requires ``source_id``) supersedes the previous document with the same
    (collection, source_id) in the same transaction. Ingesting text identical to a stored
    document of the same collection and source returns that document (with
    ``deduplicated = True``) instead of creating a second one. ``format`` is ``"text"``,
    ``"markdown"`` or ``"html"``; ``chunk_size``/``chunk_overlap`` override the chunker's
    options.

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
    ``"raise"`` (or ``"abort"``, Arcana's name) stores nothing.

    Every option is checked before anything is read or written: an unknown one raises
    :class:`~django_rag.exceptions.InvalidOption` naming the closest known option.
    """
    request = build_ingest_request("ingest", options)
    return ingest_parsed(text_document(text, request.format), request)


def ingest_file(path: str | Path, **options: Unpack[IngestOptions]) -> Document:
    """Parse the file at ``path`` (by extension) and ingest it; options as for :func:`ingest`
    (but ``format``: the extension decides). The parse runs in a bounded worker
    (``MAX_PARSE_MEMORY``, ``PARSE_TIMEOUT``)."""
    request = build_ingest_request("ingest_file", options)
    clean_filename(str(path))
    parsed = parse_file_isolated(path)
    return ingest_parsed(parsed, request, filename=Path(path).name)


def ingest_bytes(data: bytes, *, filename: str, **options: Unpack[IngestOptions]) -> Document:
    """Parse ``data`` as a file called ``filename`` and ingest it; nothing touches disk. The
    parse runs in a bounded worker (``MAX_PARSE_MEMORY``, ``PARSE_TIMEOUT``), as every parse.
    Options as for :func:`ingest` (but ``format``: the file name's extension decides).

    With ``background=True`` the bytes are not parsed here: they are stored with the pending
    document, and the job parses them (in a child process limited to ``MAX_PARSE_MEMORY``),
    then chunks and embeds. Only cheap checks run now (the options, the file type, its size);
    a file the parser refuses leaves the document and the job ``failed`` with the typed
    error's message. This is how the dashboard ingests uploads: the web process never holds
    what parsing a hostile file would take.
    """
    request = build_ingest_request("ingest_bytes", options)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidOption(f"data must be bytes, got {type(data).__name__}")
    clean_filename(filename)
    if request.background:
        return ingest_upload(bytes(data), request, filename=filename)
    parsed = parse_isolated(bytes(data), filename=filename)
    return ingest_parsed(parsed, request, filename=Path(filename).name)


def ingest_parsed(
    parsed: ParsedDocument, request: IngestRequest, *, filename: str = ""
) -> Document:
    """Ingest one parsed document as ``request`` says (what :func:`ingest`, :func:`ingest_file`
    and :func:`ingest_bytes` run once their input is text)."""
    name = request.collection_name
    with span(
        "ingest",
        text=parsed.text,
        collection=name,
        source_id=request.source_id,
        filename=filename,
        chars=len(parsed.text) if isinstance(parsed.text, str) else None,
    ) as s:
        pending = validate(
            parsed,
            collection=name,
            title=request.title,
            metadata=request.metadata,
            source_id=request.source_id,
            replace=request.replace,
            filename=filename,
        )
        apply_description(name, request.collection.description)  # once the document is valid
        if not isinstance(pending, Pending):
            s.set(document_id=pending.pk, chunk_count=pending.chunk_count, deduplicated=True)
            return pending
        take_versions([pending])
        if request.background:
            document = enqueue_document(pending, request.job_options)
            s.set(document_id=document.pk, background=True, status=document.status)
            return document
        prepared = prepare_document(pending, request)
        document = store_prepared(pending, prepared)
        s.set(
            document_id=document.pk,
            collection=pending.collection,
            chunk_count=len(prepared.chunks),
            deduplicated=document.deduplicated,
        )
        return document


def ingest_source(text: str, request: IngestRequest, *, version: int) -> Document:
    """Replace ``(collection, source_id)`` of ``request`` (built for ``"sync"``) with ``text``
    at ``version``, a version taken earlier (:func:`~django_rag.store.next_versions`) when the
    change was made: model sync takes it as the row's change commits, so the order of changes
    decides what stays, not the order the jobs run in. Returns the stored document
    (``superseded`` when a newer version won)."""
    pending = validate(
        text_document(text, request.format),
        collection=request.collection_name,
        title=request.title,
        metadata=request.metadata,
        source_id=request.source_id,
        replace=True,
        check_duplicate=False,
    )
    apply_description(request.collection_name, request.collection.description)
    pending.document.version = version
    return store_prepared(pending, prepare_document(pending, request))


@rejects_unknown_options("delete()")
def delete(document: Document | int | str, *, graph_store: Any = None) -> None:
    """Delete a document (instance or id), its chunks and the graph entities only it
    mentioned, in ``graph_store`` (None: ``GRAPH["STORE"]``)."""
    pk = document.pk if isinstance(document, Document) else document
    if isinstance(pk, str) and pk.isascii() and pk.strip().isdigit():
        pk = int(pk)
    if isinstance(pk, bool) or not isinstance(pk, int) or not 0 < pk < 2**63:
        # Not an id at all ("abc", None, 1.5): no document has it.
        raise DocumentNotFound(
            f"No document with id {pk!r}: document ids are positive integers.", id=pk
        )
    with span("delete", document_id=pk):
        deleted = delete_document(pk, graph_store=graph_store)
    if not deleted:
        raise DocumentNotFound(f"No document with id {pk!r}.", id=pk)

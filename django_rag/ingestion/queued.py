"""Background ingestion: a validated document (or an unparsed upload) stored as ``pending`` with
its job, and the job's body (:func:`process_pending`), which parses, chunks, embeds and stores it
through the same steps as a foreground ingest.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from ..background import enqueue
from ..embeddings import get_embedder
from ..exceptions import DocumentNotFound, DocumentSuperseded
from ..models import Document, Job
from ..models.databases import write_db
from ..signals import span
from ..store import delete_document, mark_document, next_versions, save_pending, touch_source
from ..store.documents import find_duplicate
from ..store.uploads import discard_upload, record_parsed, save_upload, upload_of
from ..validation import (
    clean_metadata,
    clean_source_id,
    clean_text,
    clean_title,
)
from .chunkers import chunk_options, get_chunker
from .collections import apply_description
from .isolation import parse_isolated
from .parsers import Page, ParsedDocument, check_input_size, get_parser
from .pipeline import (
    Pending,
    content_hash,
    prepare_document,
    store_prepared,
)
from .request import CollectionTarget, IngestRequest, normalize_on_chunk_error


def ingest_upload(data: bytes, request: IngestRequest, *, filename: str) -> Document:
    """Store an upload's bytes with a pending document and queue the job that parses, chunks
    and embeds it (``ingest_bytes(..., background=True)``: ``request`` is checked already)."""
    parser = get_parser(filename)  # an unsupported type is refused now, unread
    check_input_size(parser, len(data), filename=filename)
    source_id = clean_source_id(request.source_id)
    title = clean_title(request.title)
    metadata = clean_metadata(request.metadata)
    name = request.collection_name
    apply_description(name, request.collection.description)
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
                "replace": request.replace,
                "upload": True,
                **request.job_options,
            },
        )
        document = _queue(document, job)
        s.set(document_id=document.pk, background=True, status=document.status)
        return document


def enqueue_document(pending: Pending, options: dict[str, Any]) -> Document:
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
        pending = Pending(document.collection.name, document, parsed, replace)
        # The options were checked when the job was submitted: rebuilt as they were stored.
        sizes = chunk_options(params.get("chunk_size"), params.get("chunk_overlap"))
        request = IngestRequest(
            collection=CollectionTarget(pending.collection),
            chunker=get_chunker(None, **sizes),
            embedder=get_embedder(),
            **sizes,
            graph=bool(params.get("graph")),
            on_chunk_error=normalize_on_chunk_error(params.get("on_chunk_error", "raise")),
        )
        # The jobs page shows chunks embedded / chunks.
        prepared = prepare_document(pending, request, progress=job.report)
        stored = store_prepared(pending, prepared)
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

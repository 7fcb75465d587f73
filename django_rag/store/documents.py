"""Writing documents and chunks: the one path every ingest, replace and delete ends in.

Lock order, the same in every transaction that writes documents (so no cycle can form):

1. the identity lock of the (collection, source) being written (advisory, transaction level);
2. the rows of the documents being replaced or deleted, in id order (``FOR UPDATE``);
3. their chunks and the rows that hang on chunks (only ever reached through 2);
4. the collection's graph lock (advisory), when graph rows change.

The BM25 statistics are appended by triggers and never waited on (see
:mod:`django_rag.store.statistics`). A deadlock or serialization failure that PostgreSQL still
reports (another application's locks, say) is retried when the write owns its transaction.

Everything here runs on the write database (:func:`~django_rag.models.databases.write_db`),
reads included: a replica that searches use may lag, and a write must decide on the primary.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError, connections, models, transaction

from ..conf import scrub_text
from ..models import Chunk, Collection, Document
from ..models.databases import write_db
from ..signals import span
from .graph import persist, sweep_orphans
from .statistics import compact_statistics, search_vectors
from .vector_stores import sync_deleted, sync_stored

logger = logging.getLogger(__name__)

T = TypeVar("T")

# SQLSTATEs worth another attempt: deadlock_detected, serialization_failure.
_RETRYABLE = {"40P01", "40001"}
ATTEMPTS = 5


@dataclass
class ChunkRow:
    """One chunk ready to store: its text, place in the document and vector."""

    chunk_index: int
    text: str
    embedding: Sequence[float]
    token_count: int = 0
    start_char: int | None = None
    end_char: int | None = None
    page_start: int | None = None
    page_end: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def retry_transient(write: Callable[[], T], *, what: str) -> T:
    """Run ``write`` (which opens its own transaction) again when PostgreSQL aborts it with a
    deadlock or serialization failure. Inside a caller's transaction nothing can be retried:
    the error goes to the caller."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return write()
        except DatabaseError as exc:
            code = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
            in_atomic = connections[write_db()].in_atomic_block
            if code not in _RETRYABLE or in_atomic or attempt == ATTEMPTS:
                raise
            logger.warning("%s: %s, attempt %d of %d", what, code, attempt, ATTEMPTS)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def lock_identity(collection: str, source_id: str, content_hash: str) -> None:
    """Serialise writers of one (collection, source) identity until the transaction ends:
    replace and dedup decide on committed state, so concurrent replaces end with one document."""
    identity = source_id or f"#{content_hash}"
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"django_rag:document:{collection}:{identity}"],
        )


def find_duplicate(collection: str, source_id: str, content_hash: str) -> Document | None:
    """The newest completed document of this identity with this content, if any (read on the
    write database: a replica may not have it yet)."""
    return (
        Document.objects.using(write_db())
        .filter(
            collection__name=collection,
            source_id=source_id,
            content_hash=content_hash,
            status=Document.Status.COMPLETED,
        )
        .order_by("-created_at", "-id")
        .first()
    )


def get_collection(name: str) -> Collection:
    collection, _ = Collection.objects.using(write_db()).get_or_create(name=name)
    return collection


def save_pending(document: Document, collection: str) -> Document:
    """Store ``document`` (unsaved) as ``pending``, waiting for a worker to chunk it."""
    db = write_db()
    with transaction.atomic(using=db):
        document.collection = get_collection(collection)
        document.status = Document.Status.PENDING
        document.chunk_count = 0
        document.error = ""
        document.save(using=db)
    return document


def mark_document(document_id: int, status: str, error: str = "") -> None:
    """Set a pending document's status (``processing``, ``failed`` with its error)."""
    Document.objects.using(write_db()).filter(pk=document_id).exclude(
        status=Document.Status.COMPLETED
    ).update(status=status, error=scrub_text(error)[:2000])


def write_document(
    document: Document,
    chunks: Sequence[ChunkRow],
    *,
    collection: str,
    model_name: str,
    replace: bool = False,
    extractions: Sequence[Any] | None = None,
) -> Document:
    """Store ``document`` with its chunks (and their graph extractions) in one transaction.

    ``document`` is new (unsaved) or a pending one a worker completes. With ``replace``, the
    other documents of the same (collection, source_id) go in the same transaction, with the
    graph entities only they mentioned. A new document whose content equals a stored one of the
    same identity is not stored again: the stored one is returned with ``deduplicated = True``.
    """

    new = document.pk is None

    def write() -> Document:
        if new:  # a retry after a rollback: the first attempt's primary key is void
            document.pk = None
            document._state.adding = True
        with (
            span(
                "vector_store.store",
                backend="PgVectorStore",
                collection=collection,
                chunk_count=len(chunks),
            ),
            transaction.atomic(using=write_db()),
        ):
            return _write(document, chunks, collection, model_name, replace, extractions)

    return retry_transient(write, what="write_document")


def _write(document, chunks, name, model_name, replace, extractions) -> Document:
    db = write_db()
    lock_identity(name, document.source_id, document.content_hash)
    collection = get_collection(name)
    if document.pk is not None:
        # A pending document: it may have been deleted meanwhile, or completed by an earlier
        # delivery of the same task.
        current = Document.objects.using(db).select_for_update().filter(pk=document.pk).first()
        if current is None or current.status == Document.Status.COMPLETED:
            return current or document
    duplicate = find_duplicate(name, document.source_id, document.content_hash)
    if replace:
        others = Document.objects.using(db).filter(
            collection=collection, source_id=document.source_id
        )
        keep = {pk for pk in (duplicate and duplicate.pk, document.pk) if pk is not None}
        delete_documents(others.exclude(pk__in=keep).values_list("pk", flat=True))
    if duplicate is not None and document.pk is None:
        duplicate.deduplicated = True
        return duplicate
    document.collection = collection
    document.status = Document.Status.COMPLETED  # ``error`` may note skipped chunks
    document.chunk_count = len(chunks)
    if document.pk is None:
        document.save(using=db)
    else:
        delete_chunks(Chunk.objects.using(db).filter(document_id=document.pk))  # a retried task
        document.save(
            using=db, update_fields=["collection", "status", "error", "chunk_count", "updated_at"]
        )
    stored = insert_chunks(document, collection, chunks, model_name)
    if extractions is not None:
        # The graph goes in with the chunks: a failure leaves neither.
        persist(collection.pk, [chunk.pk for chunk in stored], extractions)
    sync_stored(stored, document=document)
    _compact_on_commit(db)
    document.deduplicated = False
    return document


def insert_chunks(
    document: Document, collection: Collection, chunks: Sequence[ChunkRow], model_name: str
) -> list[Chunk]:
    # Full-text vectors go in with the rows (an UPDATE afterwards would insert every chunk
    # into the HNSW index twice); triggers record the BM25 statistics in this transaction.
    db = write_db()
    vectors = search_vectors([chunk.text for chunk in chunks], using=db)
    return Chunk.objects.using(db).bulk_create(
        [
            Chunk(
                document=document,
                collection=collection,
                chunk_index=chunk.chunk_index,
                text=chunk.text,
                token_count=chunk.token_count,
                start_char=chunk.start_char,
                end_char=chunk.end_char,
                page_start=chunk.page_start,
                page_end=chunk.page_end,
                metadata=chunk.metadata,
                embedding=list(chunk.embedding),
                embedding_model=model_name,
                search_vector=vector,
                fts_length=length,
            )
            for chunk, (vector, length) in zip(chunks, vectors, strict=True)
        ],
        batch_size=500,
    )


def delete_chunks(chunks: models.QuerySet) -> list[int]:
    """Delete these chunks and what hangs on them, each table in one statement (Django's
    collector would load every chunk, vectors included, and delete 100 at a time). Returns
    the deleted chunk ids. Run inside a transaction that holds the documents' row locks."""
    db = write_db()
    chunks = chunks.using(db)
    ids = list(chunks.order_by().values_list("pk", flat=True))
    if not ids:
        return []
    selected = Chunk.objects.using(db).filter(pk__in=chunks.order_by().values("pk"))
    for relation in _relations_to(Chunk):
        dependents = relation.related_model._base_manager.using(db).filter(
            **{f"{relation.field.name}__in": selected}
        )
        if relation.on_delete is models.SET_NULL:
            dependents.update(**{relation.field.name: None})
        elif relation.on_delete is models.CASCADE:
            dependents.delete()
    with connections[db].cursor() as cursor:
        # One statement: the statistics trigger fires once for the whole set.
        cursor.execute(f"DELETE FROM {Chunk._meta.db_table} WHERE id = ANY(%s)", [ids])
    return ids


def _relations_to(model) -> list:
    """Every foreign key pointing at ``model``, hidden ones (``related_name="+"``) included."""
    return [
        field
        for field in model._meta.get_fields(include_hidden=True)
        if field.auto_created and not field.concrete and (field.one_to_many or field.one_to_one)
    ]


def delete_documents(ids: Sequence[int] | models.QuerySet) -> int:
    """Delete documents with their chunks, graph mentions and orphaned entities. Run inside a
    transaction (every caller in the store is). Returns how many documents were deleted."""
    db = write_db()
    if isinstance(ids, models.QuerySet):
        ids = ids.using(db)  # a caller's queryset would read where the routers say
    locked = list(
        Document.objects.using(db)
        .select_for_update()
        .filter(pk__in=list(ids))
        .order_by("pk")
        .values_list("pk", "collection_id")
    )
    if not locked:
        return 0
    pks = [pk for pk, _ in locked]
    chunk_ids = delete_chunks(Chunk.objects.using(db).filter(document_id__in=pks))
    Document.objects.using(db).filter(pk__in=pks).delete()
    for collection_id in sorted({collection_id for _, collection_id in locked}):
        # Entities no chunk mentions any more, in this collection only.
        sweep_orphans(collection_id)
    sync_deleted(chunk_ids)
    _compact_on_commit(db)
    return len(pks)


def delete_document(pk: int) -> bool:
    """Delete one document (see :func:`delete_documents`); False when it does not exist."""

    def write() -> bool:
        with transaction.atomic(using=write_db()):
            return delete_documents([pk]) > 0

    return retry_transient(write, what="delete_document")


def _compact_on_commit(db: str) -> None:
    """Fold the statistics deltas on ``db`` once the writing transaction commits."""
    transaction.on_commit(functools.partial(compact_statistics, using=db), using=db)

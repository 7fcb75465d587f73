"""Writing documents and chunks: the one path every ingest, replace and delete ends in.

Lock order, the same in every transaction that writes documents (so no cycle can form):

1. the identity lock of the (collection, source) being written (advisory, transaction level);
   a batch (:func:`write_documents`) takes the locks of all its identities, in key order;
2. the rows of the documents being replaced or deleted, in id order (``FOR UPDATE``);
3. their chunks and the rows that hang on chunks (only ever reached through 2);
4. the collection's graph lock (advisory), when graph rows change.

The BM25 statistics are appended by triggers and never waited on (see
:mod:`django_rag.store.statistics`). A deadlock or serialization failure that PostgreSQL still
reports (another application's locks, say) is retried when the write owns its transaction.

Writes of one identity are ordered by version (docs/architecture.md, "The newest version wins"):
each document takes a version from a sequence when it is submitted; a replace deletes only the
older versions of its identity and records its own in the identity's :class:`SourceVersion`
row, and a write older than that row is superseded (not stored) instead of deleting newer work.

This module holds the writes (:func:`write_document`, :func:`write_documents`) and the
lookups that decide them; the version fences and identity locks are in
:mod:`~django_rag.store.fences`, deletes in :mod:`~django_rag.store.deletes`, the chunk rows'
inserts in :mod:`~django_rag.store.rows`, the retry of a deadlocked transaction in
:mod:`~django_rag.store.transactions`. Their public names are importable from here too.

Everything here runs on the write database (:func:`~django_rag.models.databases.write_db`),
reads included: a replica that searches use may lag, and a write must decide on the primary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ..conf import scrub_text
from ..exceptions import DocumentSuperseded
from ..models import Chunk, Collection, Document
from ..models.databases import on_live_connection, write_db
from ..signals import span
from . import rows
from .deletes import (  # noqa: F401 (delete_document, delete_source are re-exported)
    delete_chunks,
    delete_document,
    delete_documents,
    delete_source,
)
from .fences import (  # noqa: F401 (next_versions, touch_source... are re-exported)
    SupersededWrite,
    ensure_versions,
    identity_key,
    lock_identities,
    lock_identity,
    next_versions,
    older_versions,
    raise_fences,
    source_fences,
    touch_source,
)
from .graph_stores import store_of
from .rows import (  # noqa: F401 (COPY_ROWS, copy_chunks, insert_chunks are re-exported)
    COPY_ROWS,
    ChunkRow,
    copy_chunks,
    insert_chunks,
    inserted_chunk,
)
from .transactions import (  # noqa: F401 (ATTEMPTS, compact_on_commit are re-exported)
    ATTEMPTS,
    compact_on_commit,
    retry_transient,
)
from .vector_stores import receiving_store, sync_stored


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


def collection_exists(name: str) -> bool:
    """Whether a collection called ``name`` is stored (read on the database writes go to)."""
    return Collection.objects.using(write_db()).filter(name=name).exists()


def describe_collection(name: str, description: str) -> Collection:
    """The collection ``name``, created with ``description`` when missing; an existing one
    gets ``description`` only when its own is empty (a curated description is never
    overwritten by an ingest that names the collection with another)."""
    db = write_db()
    collection, created = Collection.objects.using(db).get_or_create(
        name=name, defaults={"description": description}
    )
    if not created and description and not collection.description:
        # Conditional update: a concurrent writer's description, if any, wins.
        Collection.objects.using(db).filter(pk=collection.pk, description="").update(
            description=description
        )
        collection.refresh_from_db(using=db, fields=["description"])
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
    """Set a pending document's status (``processing``, ``failed`` with its error); a failure
    is recorded on a fresh connection when the one it broke is gone."""
    db = write_db()
    on_live_connection(
        db,
        lambda: (
            Document.objects.using(db)
            .filter(pk=document_id)
            .exclude(status=Document.Status.COMPLETED)
            .update(status=status, error=scrub_text(error)[:2000])
        ),
    )


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
    older versions of the same (collection, source_id) go in the same transaction, with the
    graph entities only they mentioned (a newer version still pending stays). A new document
    whose content equals a stored one of the same identity is not stored again: the stored one
    is returned with ``deduplicated = True``.

    Raises :class:`~django_rag.exceptions.DocumentSuperseded` when a newer version of the
    identity has already replaced or deleted it (a pending document is then removed).
    """

    new = document.pk is None
    ensure_versions([document])

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

    result = retry_transient(write, what="write_document")
    if isinstance(result, SupersededWrite):
        raise result.error()
    return result


def _write(document, chunks, name, model_name, replace, extractions) -> Document | SupersededWrite:
    db = write_db()
    lock_identity(name, document.source_id, document.content_hash)
    collection = get_collection(name)
    if document.pk is not None:
        # A pending document: it may have been deleted meanwhile (by a newer version's replace,
        # or by hand), or completed by an earlier delivery of the same task.
        current = Document.objects.using(db).select_for_update().filter(pk=document.pk).first()
        if current is None:
            newer = source_fences(collection, [document.source_id]).get(document.source_id, 0)
            return SupersededWrite(name, document.source_id, document.version, newer)
        if current.status == Document.Status.COMPLETED:
            return current
    newer = source_fences(collection, [document.source_id]).get(document.source_id)
    if newer is not None and newer > document.version:
        if document.pk is not None:
            delete_documents([document.pk])
        return SupersededWrite(name, document.source_id, document.version, newer)
    duplicate = find_duplicate(name, document.source_id, document.content_hash)
    if replace:
        versions = {document.source_id: document.version}
        raise_fences(collection, versions, deleted=False)
        # A pending document is written even when a stored one has its content (it replaces
        # it); a new one is not stored again.
        keep = {document.pk} if document.pk is not None else {duplicate and duplicate.pk}
        # The older versions' graph is in the store this version's goes to.
        graph_store = getattr(extractions, "store", None)
        delete_documents(older_versions(collection, versions, keep), graph_store=graph_store)
    if duplicate is not None and document.pk is None:
        duplicate.deduplicated = True
        return duplicate
    document.collection = collection
    document.status = Document.Status.COMPLETED  # ``error`` may note skipped chunks
    document.chunk_count = len(chunks)
    if document.pk is None:
        document.save(using=db)
    else:
        # A retried task: its first attempt's chunks (and their graph mentions) go.
        gone = delete_chunks(Chunk.objects.using(db).filter(document_id=document.pk))
        if extractions is not None:
            store_of(extractions).forget_chunks(gone)
        document.save(
            using=db, update_fields=["collection", "status", "error", "chunk_count", "updated_at"]
        )
    stored = rows.insert_chunks(document, collection, chunks, model_name)
    if extractions is not None:
        # The graph goes in with the chunks: a failure leaves neither.
        store_of(extractions).persist(collection.pk, [chunk.pk for chunk in stored], extractions)
    sync_stored(stored, document=document)
    compact_on_commit(db)
    document.deduplicated = False
    return document


@dataclass
class DocumentWrite:
    """One new document of a batch for :func:`write_documents`."""

    document: Document  # new, unsaved
    chunks: Sequence[ChunkRow]
    replace: bool = False
    extractions: Sequence[Any] | None = None


def find_duplicates(
    collection: str, identities: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Document]:
    """:func:`find_duplicate` for many (source_id, content_hash) pairs in one query: the newest
    completed document of each pair that has one."""
    if not identities:
        return {}
    pairs = sorted(set(identities))
    db = write_db()
    found = (
        Document.objects.using(db)
        .filter(
            collection__name=collection,
            status=Document.Status.COMPLETED,
            content_hash__in=sorted({digest for _, digest in pairs}),
            source_id__in=sorted({source for source, _ in pairs}),
        )
        .order_by("created_at", "id")  # the newest last: it wins below
        .values_list("pk", "source_id", "content_hash")
    )
    wanted = set(pairs)
    newest = {(source, digest): pk for pk, source, digest in found if (source, digest) in wanted}
    if not newest:
        return {}
    loaded = Document.objects.using(db).in_bulk(list(newest.values()))
    return {key: loaded[pk] for key, pk in newest.items() if pk in loaded}


def write_documents(
    writes: Sequence[DocumentWrite], *, collection: str, model_name: str, compact: bool = True
) -> list[Document | DocumentSuperseded]:
    """Store many new documents with their chunks: what :func:`write_document` does for one,
    with a constant number of statements per batch (identity locks, versions, duplicate check,
    replaced documents, document rows, chunk rows) instead of per document.

    Returns, in input order, the stored document, the stored duplicate (with
    ``deduplicated = True``) or, for a document a newer version of its identity has already
    replaced or deleted, a :class:`~django_rag.exceptions.DocumentSuperseded` (not raised: the
    rest of the batch is stored). The batch is written in one transaction, except where an
    identity (collection, source_id) comes back in it: the batch is cut there, so each run is
    atomic and the result is the same as writing the documents one by one, in order.

    ``compact=False`` leaves the statistics deltas for the caller to fold
    (:func:`~django_rag.store.compact_statistics`; readers count pending deltas either way):
    a bulk load folds them every few thousand chunks instead of after every group.
    """
    results: list[Document | DocumentSuperseded] = []
    run: list[DocumentWrite] = []
    seen: set[str] = set()
    for write in writes:
        if write.document.pk is not None:
            raise ValueError("write_documents stores new documents; use write_document")
    ensure_versions([write.document for write in writes])
    for write in writes:
        key = identity_key(collection, write.document.source_id, write.document.content_hash)
        if key in seen:
            results.extend(_write_run(run, collection, model_name, compact))
            run, seen = [], set()
        run.append(write)
        seen.add(key)
    if run:
        results.extend(_write_run(run, collection, model_name, compact))
    return results


def _write_run(
    run: list[DocumentWrite], name: str, model_name: str, compact: bool
) -> list[Document | DocumentSuperseded]:
    def write() -> list[Document | SupersededWrite]:
        for item in run:  # a retry after a rollback: the first attempt's keys are void
            item.document.pk = None
            item.document._state.adding = True
        with (
            span(
                "vector_store.store",
                backend="PgVectorStore",
                collection=name,
                document_count=len(run),
                chunk_count=sum(len(item.chunks) for item in run),
            ),
            transaction.atomic(using=write_db()),
        ):
            return _write_many(run, name, model_name, compact)

    written = retry_transient(write, what="write_documents")
    return [item.error() if isinstance(item, SupersededWrite) else item for item in written]


def _write_many(
    run: list[DocumentWrite], name: str, model_name: str, compact: bool
) -> list[Document | SupersededWrite]:
    db = write_db()
    identities = [(item.document.source_id, item.document.content_hash) for item in run]
    lock_identities(name, identities)
    collection = get_collection(name)
    fences = source_fences(collection, [source for source, _ in identities])
    late = {
        index: fences[item.document.source_id]
        for index, item in enumerate(run)
        if fences.get(item.document.source_id, 0) > item.document.version
    }
    duplicates = find_duplicates(name, identities)
    replaced = {
        item.document.source_id: item.document.version
        for index, item in enumerate(run)
        if item.replace and index not in late
    }
    if replaced:
        raise_fences(collection, replaced, deleted=False)
        keep = {document.pk for document in duplicates.values()}
        # One call's batch: its documents' graph goes to one store, the older versions' too.
        graph_store = next(
            (getattr(i.extractions, "store", None) for i in run if i.extractions is not None),
            None,
        )
        delete_documents(older_versions(collection, replaced, keep), graph_store=graph_store)
    results: list[Document | SupersededWrite] = []
    new: list[DocumentWrite] = []
    for index, (item, identity) in enumerate(zip(run, identities, strict=True)):
        if index in late:
            document = item.document
            results.append(SupersededWrite(name, document.source_id, document.version, late[index]))
            continue
        duplicate = duplicates.get(identity)
        if duplicate is not None:
            duplicate.deduplicated = True
            results.append(duplicate)
            continue
        document = item.document
        document.collection = collection
        document.status = Document.Status.COMPLETED
        document.chunk_count = len(item.chunks)
        document.deduplicated = False
        new.append(item)
        results.append(document)
    if not new:
        return results
    Document.objects.using(db).bulk_create([item.document for item in new], batch_size=1000)
    needs_rows = receiving_store() is not None or any(item.extractions is not None for item in new)
    ids = rows.copy_chunks(
        [(item.document.pk, row) for item in new for row in item.chunks],
        collection_id=collection.pk,
        model_name=model_name,
    )
    offset = 0
    for item in new:
        own = ids[offset : offset + len(item.chunks)]
        offset += len(item.chunks)
        if not needs_rows:
            continue
        stored = [
            inserted_chunk(item.document, collection, row, model_name, pk)
            for row, pk in zip(item.chunks, own, strict=True)
        ]
        if item.extractions is not None:
            store_of(item.extractions).persist(collection.pk, own, item.extractions)
        sync_stored(stored, document=item.document)
    if compact:
        compact_on_commit(db)
    return results

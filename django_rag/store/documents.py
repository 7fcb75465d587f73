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

Everything here runs on the write database (:func:`~django_rag.models.databases.write_db`),
reads included: a replica that searches use may lag, and a write must decide on the primary.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from django.db import DatabaseError, connections, models, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3
from django.utils import timezone

from ..conf import get_setting, scrub_text
from ..exceptions import DocumentSuperseded
from ..models import Chunk, Collection, Document, Job, SourceVersion
from ..models.databases import on_live_connection, write_db
from ..models.documents import VERSION_SEQUENCE
from ..models.fulltext import LENGTH_SQL
from ..signals import span
from .graph import persist, sweep_orphans
from .headers import indexed_sql
from .statistics import compact_statistics
from .vector_stores import _receiving_store, sync_deleted, sync_stored

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


def next_versions(count: int) -> list[int]:
    """``count`` new document versions, ascending, in one statement. Taken when a document is
    submitted (before it is embedded or queued), so versions follow the order of the calls."""
    if count <= 0:
        return []
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT nextval(%s::regclass) FROM generate_series(1, %s)", [VERSION_SEQUENCE, count]
        )
        return [row[0] for row in cursor.fetchall()]


def _has_version(document: Document) -> bool:
    return isinstance(document.version, int)


def _ensure_versions(documents: Sequence[Document]) -> None:
    missing = [document for document in documents if not _has_version(document)]
    for document, version in zip(missing, next_versions(len(missing)), strict=True):
        document.version = version


def _fences(collection: Collection, source_ids: Sequence[str]) -> dict[str, int]:
    """The identities' :class:`SourceVersion` (the newest replace or delete written)."""
    wanted = sorted({source for source in source_ids if source})
    if not wanted:
        return {}
    return dict(
        SourceVersion.objects.using(write_db())
        .filter(collection=collection, source_id__in=wanted)
        .values_list("source_id", "version")
    )


def _raise_fences(collection: Collection, versions: dict[str, int], *, deleted: bool) -> None:
    """Record that ``versions`` (source_id -> version) replaced (or deleted) their identities;
    a fence only ever moves forward."""
    if not versions:
        return
    sources = sorted(versions)
    table = SourceVersion._meta.db_table
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} AS f (collection_id, source_id, version, deleted, updated_at)
            SELECT %s, s, v, %s, now() FROM unnest(%s::text[], %s::bigint[]) AS u (s, v)
            ON CONFLICT (collection_id, source_id) DO UPDATE
            SET version = EXCLUDED.version, deleted = EXCLUDED.deleted, updated_at = now()
            WHERE f.version < EXCLUDED.version
            """,
            [collection.pk, deleted, sources, [versions[source] for source in sources]],
        )


def _older_versions(collection: Collection, versions: dict[str, int], keep: set[int]) -> list[int]:
    """Ids of the documents of each identity older than its version in ``versions``."""
    if not versions:
        return []
    rows = (
        Document.objects.using(write_db())
        .filter(collection=collection, source_id__in=sorted(versions))
        .values_list("pk", "source_id", "version")
    )
    return sorted(
        pk for pk, source, version in rows if version < versions[source] and pk not in keep
    )


@dataclass
class _Superseded:
    """What a write returns from inside its transaction when it came too late (raised as
    :class:`DocumentSuperseded` once the transaction has committed the pending row's removal)."""

    collection: str
    source_id: str
    version: int
    newer: int

    def error(self) -> DocumentSuperseded:
        return DocumentSuperseded(self.collection, self.source_id, self.version, self.newer)


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
    _ensure_versions([document])

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
    if isinstance(result, _Superseded):
        raise result.error()
    return result


def _write(document, chunks, name, model_name, replace, extractions) -> Document | _Superseded:
    db = write_db()
    lock_identity(name, document.source_id, document.content_hash)
    collection = get_collection(name)
    if document.pk is not None:
        # A pending document: it may have been deleted meanwhile (by a newer version's replace,
        # or by hand), or completed by an earlier delivery of the same task.
        current = Document.objects.using(db).select_for_update().filter(pk=document.pk).first()
        if current is None:
            newer = _fences(collection, [document.source_id]).get(document.source_id, 0)
            return _Superseded(name, document.source_id, document.version, newer)
        if current.status == Document.Status.COMPLETED:
            return current
    newer = _fences(collection, [document.source_id]).get(document.source_id)
    if newer is not None and newer > document.version:
        if document.pk is not None:
            delete_documents([document.pk])
        return _Superseded(name, document.source_id, document.version, newer)
    duplicate = find_duplicate(name, document.source_id, document.content_hash)
    if replace:
        versions = {document.source_id: document.version}
        _raise_fences(collection, versions, deleted=False)
        # A pending document is written even when a stored one has its content (it replaces
        # it); a new one is not stored again.
        keep = {document.pk} if document.pk is not None else {duplicate and duplicate.pk}
        delete_documents(_older_versions(collection, versions, keep))
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


@dataclass
class DocumentWrite:
    """One new document of a batch for :func:`write_documents`."""

    document: Document  # new, unsaved
    chunks: Sequence[ChunkRow]
    replace: bool = False
    extractions: Sequence[Any] | None = None


def identity_key(collection: str, source_id: str, content_hash: str) -> str:
    """The advisory-lock key of a (collection, source) identity (content hash without source)."""
    return f"django_rag:document:{collection}:{source_id or '#' + content_hash}"


def lock_identities(collection: str, identities: Sequence[tuple[str, str]]) -> None:
    """:func:`lock_identity` for many (source_id, content_hash) pairs, in one statement and in
    the order of the lock keys, so two batches sharing identities cannot deadlock."""
    keys = sorted({identity_key(collection, source, digest) for source, digest in identities})
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM ("
            "SELECT DISTINCT hashtextextended(key, 0) AS k FROM unnest(%s::text[]) AS key "
            "ORDER BY 1) AS keys",
            [keys],
        )


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
    _ensure_versions([write.document for write in writes])
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
    def write() -> list[Document | _Superseded]:
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
    return [item.error() if isinstance(item, _Superseded) else item for item in written]


def _write_many(
    run: list[DocumentWrite], name: str, model_name: str, compact: bool
) -> list[Document | _Superseded]:
    db = write_db()
    identities = [(item.document.source_id, item.document.content_hash) for item in run]
    lock_identities(name, identities)
    collection = get_collection(name)
    fences = _fences(collection, [source for source, _ in identities])
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
        _raise_fences(collection, replaced, deleted=False)
        keep = {document.pk for document in duplicates.values()}
        delete_documents(_older_versions(collection, replaced, keep))
    results: list[Document | _Superseded] = []
    new: list[DocumentWrite] = []
    for index, (item, identity) in enumerate(zip(run, identities, strict=True)):
        if index in late:
            document = item.document
            results.append(_Superseded(name, document.source_id, document.version, late[index]))
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
    needs_rows = _receiving_store() is not None or any(item.extractions is not None for item in new)
    ids = copy_chunks(
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
            _chunk(item.document, collection, row, model_name, pk)
            for row, pk in zip(item.chunks, own, strict=True)
        ]
        if item.extractions is not None:
            persist(collection.pk, own, item.extractions)
        sync_stored(stored, document=item.document)
    if compact:
        _compact_on_commit(db)
    return results


def _chunk(document, collection, row: ChunkRow, model_name: str, pk: int) -> Chunk:
    """The in-memory Chunk of a row just inserted (for the graph and a receiving store)."""
    return Chunk(
        pk=pk,
        document=document,
        collection=collection,
        chunk_index=row.chunk_index,
        text=row.text,
        token_count=row.token_count,
        start_char=row.start_char,
        end_char=row.end_char,
        page_start=row.page_start,
        page_end=row.page_end,
        metadata=row.metadata,
        embedding=list(row.embedding),
        embedding_model=model_name,
    )


COPY_ROWS = 1000  # rows per INSERT: a statement stays far below PostgreSQL's 1 GB message cap


def copy_chunks(
    rows: Sequence[tuple[int, ChunkRow]], *, collection_id: int, model_name: str
) -> list[int]:
    """Insert ``(document id, row)`` pairs, ``COPY_ROWS`` per statement, and return their ids,
    in order (run it inside the writing transaction)."""
    ids: list[int] = []
    for start in range(0, len(rows), COPY_ROWS):
        ids.extend(
            _copy_chunks(
                rows[start : start + COPY_ROWS], collection_id=collection_id, model_name=model_name
            )
        )
    return ids


def _copy_chunks(
    rows: Sequence[tuple[int, ChunkRow]], *, collection_id: int, model_name: str
) -> list[int]:
    """Insert ``(document id, row)`` pairs in one statement and return their ids, in order.

    The full-text vector and its length are computed in the same statement (one pass, every
    index entry written once); the statistics triggers fire once for the whole set. With
    psycopg 3 the rows travel as binary parameters (vectors in pgvector's binary format, no
    text formatting of floats); with psycopg 2 as text."""
    if not rows:
        return []
    db = write_db()
    config = get_setting("TEXT_SEARCH_CONFIG")
    length = LENGTH_SQL.format(v="v")
    sql = f"""
        INSERT INTO {Chunk._meta.db_table}
            (document_id, collection_id, chunk_index, text, token_count, start_char, end_char,
             page_start, page_end, metadata, embedding, embedding_model, search_vector,
             fts_length, created_at)
        SELECT r.document_id, %s, r.chunk_index, r.text, r.token_count, r.start_char,
               r.end_char, r.page_start, r.page_end, r.metadata, r.embedding::vector, %s, v,
               {length}, %s
        FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::integer[], %s::integer[],
                    %s::integer[], %s::integer[], %s::integer[], %s::jsonb[], {{vectors}})
             WITH ORDINALITY
             AS r(document_id, chunk_index, text, token_count, start_char, end_char,
                  page_start, page_end, metadata, embedding, n)
             CROSS JOIN LATERAL to_tsvector(%s::regconfig, {indexed_sql("r.text", "r.metadata")}) AS v
        ORDER BY r.n
        RETURNING id, document_id, chunk_index
    """
    columns = [
        [pk for pk, _ in rows],
        [row.chunk_index for _, row in rows],
        [row.text for _, row in rows],
        [row.token_count for _, row in rows],
        [row.start_char for _, row in rows],
        [row.end_char for _, row in rows],
        [row.page_start for _, row in rows],
        [row.page_end for _, row in rows],
        [json.dumps(row.metadata or {}) for _, row in rows],
    ]
    connection = connections[db]
    connection.ensure_connection()
    if is_psycopg3:
        # A raw psycopg cursor: its errors become Django's (retry_transient and callers catch
        # django.db.DatabaseError) only through wrap_database_errors.
        with connection.wrap_database_errors, _binary_cursor(connection) as cursor:
            vectors = _packed_vectors([row.embedding for _, row in rows])
            cursor.execute(
                sql.replace("{vectors}", "%b"),
                [collection_id, model_name, timezone.now(), *columns, vectors, config],
            )
            fetched = cursor.fetchall()
    else:  # pragma: no cover - psycopg 2
        with connection.cursor() as cursor:
            vectors = [_vector_text(row.embedding) for _, row in rows]
            cursor.execute(
                sql.replace("{vectors}", "%s::text[]"),
                [collection_id, model_name, timezone.now(), *columns, vectors, config],
            )
            fetched = cursor.fetchall()
    returned = {(document, index): pk for pk, document, index in fetched}
    return [returned[(pk, row.chunk_index)] for pk, row in rows]


class _PackedVector:
    """A vector in pgvector's binary format (dimensions, unused, big-endian float4s)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def _packed_vectors(vectors: Sequence[Sequence[float]]) -> list[_PackedVector]:
    matrix = np.asarray(vectors, dtype=">f4")
    header = struct.pack(">HH", matrix.shape[1], 0)
    return [_PackedVector(header + row.tobytes()) for row in matrix]


def _binary_cursor(connection):
    """A server-side-binding psycopg cursor on Django's connection (so inside its transaction)
    that sends :class:`_PackedVector` lists as ``vector[]`` in binary."""
    import psycopg
    from psycopg.adapt import Dumper
    from psycopg.pq import Format
    from psycopg.types import TypeInfo

    raw = connection.connection
    cached = getattr(connection, "_django_rag_vector_type", None)
    if cached is None or cached[0] is not raw:
        info = TypeInfo.fetch(raw, "vector")
        if info is None:
            raise DatabaseError("the pgvector extension is not installed in this database")

        class VectorDumper(Dumper):
            format = Format.BINARY
            oid = info.oid

            def dump(self, obj):
                return obj.data

        cached = (raw, info, VectorDumper)
        connection._django_rag_vector_type = cached
    _, info, dumper = cached
    cursor = psycopg.Cursor(raw)
    info.register(cursor)
    cursor.adapters.register_dumper(_PackedVector, dumper)
    return cursor


def _vector_text(vector: Sequence[float]) -> str:
    return "[" + ",".join(map(repr, map(float, vector))) + "]"


def insert_chunks(
    document: Document, collection: Collection, chunks: Sequence[ChunkRow], model_name: str
) -> list[Chunk]:
    """Insert a document's chunks (one statement, see :func:`copy_chunks`); returns them."""
    # Full-text vectors go in with the rows (an UPDATE afterwards would insert every chunk
    # into the HNSW index twice); triggers record the BM25 statistics in this transaction.
    ids = copy_chunks(
        [(document.pk, chunk) for chunk in chunks],
        collection_id=collection.pk,
        model_name=model_name,
    )
    return [
        _chunk(document, collection, chunk, model_name, pk)
        for chunk, pk in zip(chunks, ids, strict=True)
    ]


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
        .values_list("pk", "collection_id", "status")
    )
    if not locked:
        return 0
    pks = [pk for pk, _, _ in locked]
    _supersede_jobs([pk for pk, _, status in locked if status != Document.Status.COMPLETED])
    chunk_ids = delete_chunks(Chunk.objects.using(db).filter(document_id__in=pks))
    Document.objects.using(db).filter(pk__in=pks).delete()
    for collection_id in sorted({collection_id for _, collection_id, _ in locked}):
        # Entities no chunk mentions any more, in this collection only.
        sweep_orphans(collection_id)
    sync_deleted(chunk_ids)
    _compact_on_commit(db)
    return len(pks)


def _supersede_jobs(document_ids: list[int]) -> None:
    """The ingest jobs of documents deleted before they were stored (a newer version replaced
    them, or someone deleted them) end ``superseded``: there is nothing left for them to do, and
    nothing to retry."""
    if not document_ids:
        return
    Job.objects.using(write_db()).filter(
        kind=Job.Kind.INGEST, params__document_id__in=document_ids
    ).exclude(status__in=[Job.Status.COMPLETED, Job.Status.SUPERSEDED]).update(
        status=Job.Status.SUPERSEDED,
        error="Its document was replaced by a newer version or deleted before it was stored.",
        finished_at=timezone.now(),
    )


def delete_document(pk: int) -> bool:
    """Delete one document (see :func:`delete_documents`); False when it does not exist."""

    def write() -> bool:
        with transaction.atomic(using=write_db()):
            return delete_documents([pk]) > 0

    return retry_transient(write, what="delete_document")


def delete_source(collection: str, source_id: str, *, version: int | None = None) -> int:
    """Delete every document of ``(collection, source_id)`` older than ``version`` (a new
    version when None: everything stored or pending now), and record the deletion so that an
    older write still queued or running for the source is superseded instead of bringing it
    back. Returns how many documents were deleted."""
    if not source_id:
        raise ValueError("delete_source needs a source_id")
    if version is None:
        (version,) = next_versions(1)
    collection_row = Collection.objects.using(write_db()).filter(name=collection).first()
    if collection_row is None:
        return 0

    def write() -> int:
        with transaction.atomic(using=write_db()):
            lock_identity(collection, source_id, "")
            versions = {source_id: version}
            _raise_fences(collection_row, versions, deleted=True)
            return delete_documents(_older_versions(collection_row, versions, set()))

    return retry_transient(write, what="delete_source")


def touch_source(
    collection: str,
    source_id: str,
    version: int,
    *,
    title: str | None = None,
    metadata: dict | None = None,
) -> Document | None:
    """Record that ``version`` of ``(collection, source_id)`` found its stored document current
    (same text), so an older write still running for the source is superseded; ``title`` and
    ``metadata``, when given, update that document in place (no re-embedding). Returns the
    document, or None when none is stored or a newer version got there first."""
    db = write_db()

    def write() -> Document | None:
        with transaction.atomic(using=db):
            lock_identity(collection, source_id, "")
            row = Collection.objects.using(db).filter(name=collection).first()
            if row is None or _fences(row, [source_id]).get(source_id, 0) > version:
                return None
            _raise_fences(row, {source_id: version}, deleted=False)
            document = (
                Document.objects.using(db)
                .filter(collection=row, source_id=source_id, status=Document.Status.COMPLETED)
                .order_by("-version")
                .first()
            )
            changes = {
                field: value
                for field, value in (("title", title), ("metadata", metadata))
                if value is not None and getattr(document, field, value) != value
            }
            if document is not None and changes:
                for field, value in changes.items():
                    setattr(document, field, value)
                document.save(using=db, update_fields=[*changes, "updated_at"])
            return document

    return retry_transient(write, what="touch_source")


def compact_on_commit(db: str | None = None) -> None:
    """Fold the statistics deltas on ``db`` (default: the write database) once the current
    transaction commits, or now when none is open."""
    _compact_on_commit(db or write_db())


def _compact_on_commit(db: str) -> None:
    """Fold the statistics deltas on ``db`` once the writing transaction commits."""
    transaction.on_commit(functools.partial(compact_statistics, using=db), using=db)

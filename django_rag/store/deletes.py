"""Deleting documents and chunks: what hangs on the chunks (graph mentions, the vector store's
copies) goes with them, the jobs of deleted pending documents end superseded, and a delete of an
identity records its version so a late write cannot bring it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, models, transaction
from django.utils import timezone

from ..models import Chunk, Collection, Document, Job
from ..models.databases import write_db
from .fences import lock_identity, next_versions, older_versions, raise_fences
from .graph_stores import get_graph_store
from .transactions import compact_on_commit, retry_transient
from .vector_stores import sync_deleted


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


def delete_documents(ids: Sequence[int] | models.QuerySet, *, graph_store: Any = None) -> int:
    """Delete documents with their chunks, graph mentions and orphaned entities (in
    ``graph_store``, default ``GRAPH["STORE"]``). Run inside a transaction (every caller in the
    store is). Returns how many documents were deleted."""
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
    graph = get_graph_store(graph_store)
    graph.forget_chunks(chunk_ids)
    for collection_id in sorted({collection_id for _, collection_id, _ in locked}):
        # Entities no chunk mentions any more, in this collection only.
        graph.sweep(collection_id)
    sync_deleted(chunk_ids)
    compact_on_commit(db)
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


def delete_document(pk: int, *, graph_store: Any = None) -> bool:
    """Delete one document (see :func:`delete_documents`); False when it does not exist."""

    def write() -> bool:
        with transaction.atomic(using=write_db()):
            return delete_documents([pk], graph_store=graph_store) > 0

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
            raise_fences(collection_row, versions, deleted=True)
            return delete_documents(older_versions(collection_row, versions, set()))

    return retry_transient(write, what="delete_source")

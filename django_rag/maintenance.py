"""Maintenance services: re-embedding (with a zero-downtime model switch), orphans, info.

Plain functions: the management commands, Celery tasks and the dashboard call them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .conf import embedding_dimensions, get_setting, get_settings, redact
from .embeddings import Embedder, configured_embedder, get_embedder
from .exceptions import InvalidInput, UnknownCollection
from .models import Chunk, Collection, Job
from .signals import span

logger = logging.getLogger(__name__)

CHUNKS = Chunk._meta.db_table
ENTITIES = "django_rag_entity"
SWITCH = "embedding-switch"
REEMBED = "reembed"
Progress = Callable[[int, int], None]


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.8g}" for x in vector) + "]"


def _write_batch(column: str, model_column: str, ids, vectors, model: str, job: Job) -> None:
    """Write one batch of vectors and advance the job, in one transaction (exactly once)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {CHUNKS} AS c SET {column} = v.e::vector, {model_column} = %s "
                "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::text[]) AS e) AS v "
                "WHERE c.id = v.id",
                [model, list(ids), [_vector_literal(v) for v in vectors]],
            )
        job.done += len(ids)
        job.cursor = max(ids)
        job.save(update_fields=["done", "cursor", "updated_at"])


def _embed(embedder: Embedder, texts: list[str], dimensions: int) -> list[list[float]]:
    vectors = embedder.embed_documents(texts)
    if vectors and len(vectors[0]) != dimensions:
        from .exceptions import DimensionMismatch

        raise DimensionMismatch(
            f"{embedder.model_name} returned {len(vectors[0])}-dimensional vectors, expected "
            f"{dimensions}."
        )
    return vectors


def _run_batches(
    fetch: Callable[[int], list[tuple[int, str]]],
    embedder: Embedder,
    dimensions: int,
    columns: tuple[str, str],
    job: Job,
    *,
    batch_size: int,
    concurrency: int,
    progress: Progress | None,
) -> None:
    """Fetch rows needing vectors, embed ``concurrency`` batches at once, write each batch."""
    from .llm import map_concurrently

    while rows := fetch(batch_size * concurrency):
        batches = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        embedded = map_concurrently(
            lambda batch: _embed(embedder, [text for _, text in batch], dimensions),
            batches,
            concurrency,
        )
        for batch, vectors in zip(batches, embedded, strict=True):
            ids = [pk for pk, _ in batch]
            _write_batch(*columns, ids, vectors, embedder.model_name, job)
            job.total = max(job.total, job.done)
            if progress:
                progress(job.done, job.total)


def _job(kind: str, params: dict[str, Any], resume: bool, job: Job | None) -> Job:
    if job is not None:
        # A job created by the caller (a queued task): it takes this kind and these params,
        # keeping the options it was queued with.
        options = job.params.get("options", job.params if job.kind != kind else {})
        job.kind = kind
        job.params = {**params, "options": options}
        job.save(update_fields=["kind", "params", "updated_at"])
    if job is None and resume:
        job = (
            Job.objects.filter(kind=kind, **{f"params__{k}": v for k, v in params.items()})
            .exclude(status=Job.Status.COMPLETED)
            .order_by("-id")
            .first()
        )
    if job is None:
        job = Job.objects.create(kind=kind, params=params)
    job.status = Job.Status.RUNNING
    job.error = ""
    job.save(update_fields=["status", "error", "updated_at"])
    return job


def _finish(job: Job, result: dict[str, Any]) -> Job:
    job.status = Job.Status.COMPLETED
    job.result = result
    job.finished_at = timezone.now()
    job.save()
    return job


def _fail(job: Job, exc: BaseException) -> None:
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=timezone.now()
    )


def reembed(
    *,
    collection: str | None = None,
    batch_size: int = 64,
    concurrency: int = 1,
    all: bool = False,
    resume: bool = False,
    progress: Progress | None = None,
    job: Job | None = None,
) -> Job:
    """Re-embed stored chunks in batches, each written in its own transaction.

    - With ``DJANGO_RAG["NEXT_EMBEDDER"]`` set: switch every chunk to that model without
      downtime (see :func:`switch_embedder`).
    - With ``all=True``: re-embed every chunk with the current embedder, also without downtime.
    - Otherwise: re-embed, in place, the chunks whose ``embedding_model`` differs from the
      current embedder's (optionally of one ``collection``).

    Every batch writes its vectors and the job's progress together, so a run killed at any
    point loses at most the batch in flight; running again (``resume=True`` continues the same
    job) re-embeds only what was not written.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    upcoming = configured_embedder("NEXT_EMBEDDER")
    if upcoming is not None or all:
        if collection is not None:
            raise InvalidInput(
                "A model switch re-embeds every chunk: --collection cannot be combined with "
                "NEXT_EMBEDDER or --all."
            )
        target = upcoming or configured_embedder("EMBEDDER")
        return switch_embedder(
            target,
            batch_size=batch_size,
            concurrency=concurrency,
            resume=resume,
            progress=progress,
            job=job,
        )
    return _reembed_in_place(collection, batch_size, concurrency, resume, progress, job)


def _reembed_in_place(collection, batch_size, concurrency, resume, progress, job) -> Job:
    embedder = get_embedder()
    dimensions = embedding_dimensions()
    chunks = Chunk.objects.exclude(embedding_model=embedder.model_name)
    if collection is not None:
        if not Collection.objects.filter(name=collection).exists():
            raise UnknownCollection(collection)
        chunks = chunks.filter(collection__name=collection)
    params = {"model": embedder.model_name, "collection": collection}
    job = _job(REEMBED, params, resume, job)
    job.total = job.done + chunks.count()
    job.save(update_fields=["total", "updated_at"])
    try:
        with span("reembed", model=embedder.model_name, collection=collection) as s:
            _run_batches(
                lambda limit: list(chunks.order_by("pk").values_list("pk", "text")[:limit]),
                embedder,
                dimensions,
                ("embedding", "embedding_model"),
                job,
                batch_size=batch_size,
                concurrency=concurrency,
                progress=progress,
            )
            s.set(reembedded=job.done)
    except BaseException as exc:
        _fail(job, exc)
        raise
    return _finish(job, {"reembedded": job.done, "model": embedder.model_name})


def reembed_documents(document_ids: Sequence[int], *, batch_size: int = 64) -> Job:
    """Re-embed every chunk of these documents with the current embedder, in place."""
    embedder = get_embedder()
    chunks = Chunk.objects.filter(document_id__in=list(document_ids))
    job = _job(
        REEMBED, {"model": embedder.model_name, "documents": list(document_ids)}, False, None
    )
    job.total = chunks.count()
    job.save(update_fields=["total", "updated_at"])
    cursor = {"last": 0}

    def fetch(limit: int) -> list[tuple[int, str]]:
        rows = list(
            chunks.filter(pk__gt=cursor["last"]).order_by("pk").values_list("pk", "text")[:limit]
        )
        if rows:
            cursor["last"] = rows[-1][0]
        return rows

    try:
        _run_batches(
            fetch,
            embedder,
            embedding_dimensions(),
            ("embedding", "embedding_model"),
            job,
            batch_size=batch_size,
            concurrency=1,
            progress=None,
        )
    except BaseException as exc:
        _fail(job, exc)
        raise
    return _finish(job, {"reembedded": job.done, "model": embedder.model_name})


# --- zero-downtime switch ---------------------------------------------------------------------

NEXT = "embedding_next"
NEXT_MODEL = "embedding_model_next"
NEXT_INDEX = "django_rag_chunk_hnsw_next"


def _shadow_dimensions() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
            [CHUNKS, NEXT],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return int(row[0].split("(")[1].rstrip(")"))


def _flush_deferred_checks(cursor) -> None:
    # Django's foreign keys are deferred; PostgreSQL refuses ALTER TABLE while checks of this
    # transaction are pending, so run them now.
    if connection.in_atomic_block:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _prepare_shadow(dimensions: int, fresh: bool) -> None:
    existing = _shadow_dimensions()
    with connection.cursor() as cursor:
        _flush_deferred_checks(cursor)
        if existing is not None and (fresh or existing != dimensions):
            cursor.execute(f"ALTER TABLE {CHUNKS} DROP COLUMN {NEXT}, DROP COLUMN {NEXT_MODEL}")
            existing = None
        if existing is None:
            cursor.execute(
                f"ALTER TABLE {CHUNKS} ADD COLUMN {NEXT} vector({int(dimensions)}), "
                f"ADD COLUMN {NEXT_MODEL} varchar(255)"
            )


def _pending_next(limit: int) -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, text FROM {CHUNKS} WHERE {NEXT} IS NULL ORDER BY id LIMIT %s", [limit]
        )
        return cursor.fetchall()


def switch_embedder(
    embedder: Embedder,
    *,
    batch_size: int = 64,
    concurrency: int = 1,
    resume: bool = False,
    progress: Progress | None = None,
    job: Job | None = None,
) -> Job:
    """Move every chunk to ``embedder``'s vectors without downtime.

    New vectors go to a shadow column (``embedding_next``, sized for the new model) batch by
    batch while searches keep using the current column and the current model. When every
    chunk has one (chunks ingested meanwhile included), an HNSW index is built on the shadow
    column and, in one transaction, the shadow column replaces the current one. From that
    commit on, every process embeds queries and new chunks with the new model (when it is
    ``NEXT_EMBEDDER``). A run that stops leaves the shadow column for the next run to finish.
    """
    dimensions = embedder.dimensions
    params = {"model": embedder.model_name, "dimensions": dimensions}
    job = _job(SWITCH, params, resume, job)
    try:
        with span("reembed", model=embedder.model_name, switch=True) as s:
            # A new job over a leftover shadow column of the same model keeps its vectors.
            _prepare_shadow(dimensions, fresh=False)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT count(*) FILTER (WHERE {NEXT} IS NULL), count(*) FROM {CHUNKS}"
                )
                pending, total = cursor.fetchone()
            job.total = total
            job.done = total - pending
            job.save(update_fields=["total", "done", "updated_at"])
            _fill_shadow(embedder, dimensions, job, batch_size, concurrency, progress)
            _swap(embedder, dimensions, batch_size, job)
            s.set(reembedded=job.done)
    except BaseException as exc:
        _fail(job, exc)
        raise
    return _finish(job, {"reembedded": job.done, "model": embedder.model_name})


def _fill_shadow(embedder, dimensions, job, batch_size, concurrency, progress) -> None:
    """Give every chunk still lacking one a vector in the shadow column."""
    _run_batches(
        _pending_next,
        embedder,
        dimensions,
        (NEXT, NEXT_MODEL),
        job,
        batch_size=batch_size,
        concurrency=concurrency,
        progress=progress,
    )


def _swap(embedder: Embedder, dimensions: int, batch_size: int, job: Job) -> None:
    concurrently = "" if connection.in_atomic_block else "CONCURRENTLY"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {concurrently} IF EXISTS {NEXT_INDEX}")
        # Built before the swap, while searches still use the current index.
        cursor.execute(
            f"CREATE INDEX {concurrently} {NEXT_INDEX} ON {CHUNKS} "
            f"USING hnsw ({NEXT} vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
        )
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Writers wait from here to the commit; readers keep reading the current column.
            cursor.execute(f"LOCK TABLE {CHUNKS} IN SHARE ROW EXCLUSIVE MODE")
        # Chunks ingested since the last batch.
        _fill_shadow(embedder, dimensions, job, batch_size, 1, None)
        with connection.cursor() as cursor:
            _flush_deferred_checks(cursor)
            cursor.execute(
                f"ALTER TABLE {CHUNKS} DROP COLUMN embedding, DROP COLUMN embedding_model"
            )
            cursor.execute(f"ALTER TABLE {CHUNKS} RENAME COLUMN {NEXT} TO embedding")
            cursor.execute(f"ALTER TABLE {CHUNKS} RENAME COLUMN {NEXT_MODEL} TO embedding_model")
            cursor.execute(
                f"ALTER TABLE {CHUNKS} ALTER COLUMN embedding SET NOT NULL, "
                "ALTER COLUMN embedding_model SET NOT NULL"
            )
            cursor.execute(f"ALTER INDEX {NEXT_INDEX} RENAME TO django_rag_chunk_hnsw_idx")
            cursor.execute(f"CREATE INDEX django_rag_chunk_model_idx ON {CHUNKS} (embedding_model)")
            # Entity vectors come from the old model (and may have the old size): clear them
            # and re-embed after the swap; graph matching skips entities without one meanwhile.
            cursor.execute(
                f"ALTER TABLE {ENTITIES} ALTER COLUMN embedding TYPE vector({int(dimensions)}) "
                "USING NULL"
            )
        Job.objects.filter(kind=SWITCH, params__model=embedder.model_name).exclude(
            status=Job.Status.COMPLETED
        ).update(status=Job.Status.COMPLETED, finished_at=timezone.now())
    from . import embeddings

    embeddings._switched.pop(embedder.model_name, None)
    embed_entities(embedder, batch_size=batch_size)


def embed_entities(embedder: Embedder | None = None, *, batch_size: int = 64) -> int:
    """Embed the graph entities that have no vector (``"name: description"``); returns how
    many. Run after a model switch, or to backfill entities stored while embedding failed."""
    from .models import Entity

    embedder = embedder or get_embedder()
    done = 0
    while batch := list(
        Entity.objects.filter(embedding__isnull=True)
        .order_by("pk")
        .values_list("pk", "name", "description")[:batch_size]
    ):
        texts = [
            f"{name}: {description}" if description else name for _, name, description in batch
        ]
        vectors = embedder.embed_documents(texts)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {ENTITIES} AS e SET embedding = v.e::vector "
                "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::text[]) AS e) AS v "
                "WHERE e.id = v.id",
                [[pk for pk, _, _ in batch], [_vector_literal(v) for v in vectors]],
            )
        done += len(batch)
    return done


# --- orphans -------------------------------------------------------------------------------------

_ORPHAN_CHUNKS = {
    # Impossible through the ORM (foreign keys cascade) but left behind when constraints were
    # disabled, rows were copied by hand, or a restore was partial.
    "chunks_without_document": (
        f"FROM {CHUNKS} c WHERE NOT EXISTS "
        "(SELECT 1 FROM django_rag_document d WHERE d.id = c.document_id)"
    ),
    # The chunk's denormalised collection disagrees with its document's: scoped searches
    # would show it in the wrong collection.
    "chunks_in_wrong_collection": (
        f"FROM {CHUNKS} c JOIN django_rag_document d ON d.id = c.document_id "
        "WHERE d.collection_id <> c.collection_id"
    ),
}


def find_orphans() -> dict[str, int]:
    """Count rows without a consistent parent, and a shadow column left by an abandoned
    model switch (``stale_shadow_column``: 1 when present with no switch running)."""
    found = {}
    with connection.cursor() as cursor:
        for name, where in _ORPHAN_CHUNKS.items():
            cursor.execute(f"SELECT count(*) {where}")
            found[name] = cursor.fetchone()[0]
    running = Job.objects.filter(kind=SWITCH, status=Job.Status.RUNNING).exists()
    found["stale_shadow_column"] = int(_shadow_dimensions() is not None and not running)
    return found


def remove_orphans() -> dict[str, int]:
    """Delete what :func:`find_orphans` finds, in one transaction; returns what was removed."""
    removed = find_orphans()
    with transaction.atomic():
        with connection.cursor() as cursor:
            for where in _ORPHAN_CHUNKS.values():
                cursor.execute(f"DELETE FROM {CHUNKS} WHERE id IN (SELECT c.id {where})")
            if removed["stale_shadow_column"]:
                _flush_deferred_checks(cursor)
                cursor.execute(f"DROP INDEX IF EXISTS {NEXT_INDEX}")
                cursor.execute(f"ALTER TABLE {CHUNKS} DROP COLUMN {NEXT}, DROP COLUMN {NEXT_MODEL}")
    return removed


# --- info ----------------------------------------------------------------------------------------


def info() -> dict[str, Any]:
    """Configuration (secrets redacted), the active embedder, pgvector, counts per collection."""
    from .models.managers import pgvector_version

    embedder = get_embedder()
    collections = [
        {
            "name": c.name,
            "documents": c.documents.count(),
            "chunks": Chunk.objects.filter(collection=c).count(),
        }
        for c in Collection.objects.all()
    ]
    return {
        "settings": redact(get_settings()),
        "embedder": {"model": embedder.model_name, "dimensions": embedder.dimensions},
        "embedding_dimensions": get_setting("EMBEDDING_DIMENSIONS"),
        "pgvector": pgvector_version(),
        "collections": collections,
        "chunks_by_model": dict(_chunks_by_model()),
    }


def _chunks_by_model() -> list[tuple[str, int]]:
    from django.db.models import Count

    return list(
        Chunk.objects.values("embedding_model")
        .annotate(n=Count("id"))
        .values_list("embedding_model", "n")
    )

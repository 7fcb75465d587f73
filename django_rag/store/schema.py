"""Changes to the chunk table beyond rows: vectors written in batches, the shadow column of a
zero-downtime model switch and its swap, and the removal of inconsistent rows.

Index definitions come from the ``Chunk`` model's ``Meta.indexes``, so a swapped column gets
exactly the index a fresh migration would create.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, transaction
from pgvector.django import HnswIndex

from ..models import Chunk, Entity
from ..models.databases import write_db
from .headers import indexed_sql
from .vector_stores import sync_vectors

CHUNKS = Chunk._meta.db_table
ENTITIES = Entity._meta.db_table
NEXT = "embedding_next"
NEXT_MODEL = "embedding_model_next"
NEXT_INDEX = "django_rag_chunk_hnsw_next"


def _connection():
    """The write database's connection (schema changes never go to a replica)."""
    return connections[write_db()]


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.8g}" for x in vector) + "]"


def _index(name_prefix: str):
    """The model's index on ``embedding`` / ``embedding_model``."""
    for index in Chunk._meta.indexes:
        if index.name.startswith(name_prefix):
            return index
    raise LookupError(name_prefix)


def _hnsw_sql(name: str, column: str, *, concurrently: bool) -> str:
    index = _index("django_rag_chunk_hnsw")
    assert isinstance(index, HnswIndex)
    options = ", ".join(index.get_with_params())
    return (
        f"CREATE INDEX {'CONCURRENTLY' if concurrently else ''} {name} ON {CHUNKS} "
        f"USING hnsw ({column} {index.opclasses[0]}) WITH ({options})"
    )


def write_vectors(
    ids: Sequence[int],
    vectors: Sequence[Sequence[float]],
    model: str,
    *,
    shadow: bool = False,
    after=None,
) -> None:
    """Write one batch of vectors (to the shadow column with ``shadow``), and run ``after``
    (the job's progress) in the same transaction: a batch is written exactly once."""
    column, model_column = (NEXT, NEXT_MODEL) if shadow else ("embedding", "embedding_model")
    with transaction.atomic(using=write_db()):
        with _connection().cursor() as cursor:
            cursor.execute(
                f"UPDATE {CHUNKS} AS c SET {column} = v.e::vector, {model_column} = %s "
                "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::text[]) AS e) AS v "
                "WHERE c.id = v.id",
                [model, list(ids), [vector_literal(v) for v in vectors]],
            )
        if not shadow:
            sync_vectors(ids, vectors)
        if after is not None:
            after()


def shadow_dimensions() -> int | None:
    """The size of the shadow column left by a switch, or None."""
    with _connection().cursor() as cursor:
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
    if _connection().in_atomic_block:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def prepare_shadow(dimensions: int, *, fresh: bool) -> None:
    """Add the shadow column for vectors of ``dimensions`` (a leftover one of another size, or
    any with ``fresh``, is dropped first)."""
    existing = shadow_dimensions()
    with _connection().cursor() as cursor:
        _flush_deferred_checks(cursor)
        if existing is not None and (fresh or existing != dimensions):
            cursor.execute(f"ALTER TABLE {CHUNKS} DROP COLUMN {NEXT}, DROP COLUMN {NEXT_MODEL}")
            existing = None
        if existing is None:
            cursor.execute(
                f"ALTER TABLE {CHUNKS} ADD COLUMN {NEXT} vector({int(dimensions)}), "
                f"ADD COLUMN {NEXT_MODEL} varchar(255)"
            )


def shadow_progress() -> tuple[int, int]:
    """(chunks still without a shadow vector, all chunks)."""
    with _connection().cursor() as cursor:
        cursor.execute(f"SELECT count(*) FILTER (WHERE {NEXT} IS NULL), count(*) FROM {CHUNKS}")
        pending, total = cursor.fetchone()
    return pending, total


def pending_shadow(limit: int) -> list[tuple[int, str]]:
    """(id, text to embed) of chunks without a shadow vector, by id (the text with its chunk
    header, :mod:`.headers`)."""
    with _connection().cursor() as cursor:
        cursor.execute(
            f"SELECT id, {indexed_sql()} FROM {CHUNKS} WHERE {NEXT} IS NULL ORDER BY id LIMIT %s",
            [limit],
        )
        return cursor.fetchall()


def index_shadow() -> None:
    """Build the HNSW index of the shadow column (concurrently outside a transaction), while
    searches still use the current one."""
    concurrently = not _connection().in_atomic_block
    with _connection().cursor() as cursor:
        cursor.execute(
            f"DROP INDEX {'CONCURRENTLY' if concurrently else ''} IF EXISTS {NEXT_INDEX}"
        )
        cursor.execute(_hnsw_sql(NEXT_INDEX, NEXT, concurrently=concurrently))


def lock_chunk_writes() -> None:
    """Make writers of the chunk table wait until the transaction ends (readers go on)."""
    with _connection().cursor() as cursor:
        cursor.execute(f"LOCK TABLE {CHUNKS} IN SHARE ROW EXCLUSIVE MODE")


def swap_shadow(dimensions: int) -> None:
    """Replace the embedding column by the shadow column, with the model's indexes, and clear
    the graph's entity vectors (they come from the old model). Run in the transaction that
    called :func:`lock_chunk_writes` and filled the last shadow vectors."""
    hnsw = _index("django_rag_chunk_hnsw")
    model_index = _index("django_rag_chunk_model")
    with _connection().cursor() as cursor:
        _flush_deferred_checks(cursor)
        cursor.execute(f"ALTER TABLE {CHUNKS} DROP COLUMN embedding, DROP COLUMN embedding_model")
        cursor.execute(f"ALTER TABLE {CHUNKS} RENAME COLUMN {NEXT} TO embedding")
        cursor.execute(f"ALTER TABLE {CHUNKS} RENAME COLUMN {NEXT_MODEL} TO embedding_model")
        cursor.execute(
            f"ALTER TABLE {CHUNKS} ALTER COLUMN embedding SET NOT NULL, "
            "ALTER COLUMN embedding_model SET NOT NULL"
        )
        cursor.execute(f"ALTER INDEX {NEXT_INDEX} RENAME TO {hnsw.name}")
        cursor.execute(f"CREATE INDEX {model_index.name} ON {CHUNKS} (embedding_model)")
        # Graph matching skips entities without a vector until they are embedded again.
        cursor.execute(
            f"ALTER TABLE {ENTITIES} ALTER COLUMN embedding TYPE vector({int(dimensions)}) "
            "USING NULL"
        )


# --- inconsistent rows ----------------------------------------------------------------------------

ORPHAN_CHUNKS = {
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


def count_orphans() -> dict[str, int]:
    found = {}
    with _connection().cursor() as cursor:
        for name, where in ORPHAN_CHUNKS.items():
            cursor.execute(f"SELECT count(*) {where}")
            found[name] = cursor.fetchone()[0]
    return found


def delete_orphans(*, drop_shadow: bool) -> None:
    """Delete the rows :func:`count_orphans` counts (and the shadow column), in one
    transaction."""
    with transaction.atomic(using=write_db()), _connection().cursor() as cursor:
        for where in ORPHAN_CHUNKS.values():
            cursor.execute(f"DELETE FROM {CHUNKS} WHERE id IN (SELECT c.id {where})")
        if drop_shadow:
            _flush_deferred_checks(cursor)
            cursor.execute(f"DROP INDEX IF EXISTS {NEXT_INDEX}")
            cursor.execute(f"ALTER TABLE {CHUNKS} DROP COLUMN {NEXT}, DROP COLUMN {NEXT_MODEL}")

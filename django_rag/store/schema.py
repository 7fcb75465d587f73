"""Changes to the chunk table beyond rows: vectors written in batches, the shadow column of a
zero-downtime model switch and its swap, and the removal of inconsistent rows.

Index definitions come from the ``Chunk`` model's ``Meta.indexes`` (the HNSW index of the
type ``VECTOR_INDEX_TYPE`` names, :mod:`django_rag.models.vector_index`), so a swapped column
gets exactly the index a fresh migration would create.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, transaction

from ..conf import check_index_dimensions, vector_index_type
from ..models import Chunk, Entity, vector_index
from ..models.databases import write_db
from .headers import indexed_sql
from .vector_stores import sync_vectors

CHUNKS = Chunk._meta.db_table
ENTITIES = Entity._meta.db_table
NEXT = "embedding_next"
NEXT_MODEL = "embedding_model_next"
NEXT_INDEX = "django_rag_chunk_hnsw_next"
REBUILT_INDEX = "django_rag_chunk_hnsw_rebuilt"


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


def _hnsw_sql(name: str, column: str, dimensions: int, *, concurrently: bool, connection) -> str:
    """The HNSW index of the configured type on ``column`` (refused, before any work, where
    pgvector lacks the type or cannot index vectors of this size with it)."""
    kind = vector_index_type()
    check_index_dimensions(dimensions, "VECTOR_INDEX_TYPE", kind)
    vector_index.require_supported(kind, vector_index.extension_version(connection))
    return vector_index.index_sql(
        name, CHUNKS, column, dimensions, kind=kind, concurrently=concurrently
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
    return vector_index.column_dimensions(_connection(), CHUNKS, NEXT)


def _flush_deferred_checks(cursor, connection=None) -> None:
    # Django's foreign keys are deferred; PostgreSQL refuses ALTER TABLE (and CREATE INDEX)
    # while checks of this transaction are pending, so run them now.
    if (connection or _connection()).in_atomic_block:
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
        cursor.execute(
            _hnsw_sql(
                NEXT_INDEX,
                NEXT,
                shadow_dimensions(),
                concurrently=concurrently,
                connection=_connection(),
            )
        )


def lock_chunk_writes() -> None:
    """Make writers of the chunk table wait until the transaction ends (readers go on)."""
    with _connection().cursor() as cursor:
        cursor.execute(f"LOCK TABLE {CHUNKS} IN SHARE ROW EXCLUSIVE MODE")


def swap_shadow(dimensions: int) -> None:
    """Replace the embedding column by the shadow column, with the model's indexes, and clear
    the graph's entity vectors (they come from the old model). Run in the transaction that
    called :func:`lock_chunk_writes` and filled the last shadow vectors."""
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
        cursor.execute(f"ALTER INDEX {NEXT_INDEX} RENAME TO {vector_index.HNSW_INDEX}")
        cursor.execute(f"CREATE INDEX {model_index.name} ON {CHUNKS} (embedding_model)")
        # Graph matching skips entities without a vector until they are embedded again.
        cursor.execute(
            f"ALTER TABLE {ENTITIES} ALTER COLUMN embedding TYPE vector({int(dimensions)}) "
            "USING NULL"
        )


def check_switch(dimensions: int) -> None:
    """Refuse a model switch whose vectors the configured index type cannot hold, before any
    vector is embedded (the shadow index is built only at the end)."""
    check_index_dimensions(dimensions, "NEXT_EMBEDDER")
    vector_index.require_supported(
        vector_index_type(), vector_index.extension_version(_connection())
    )


# --- the HNSW index's type ------------------------------------------------------------------------


def index_state(connection=None) -> dict:
    """What ``VECTOR_INDEX_TYPE`` asks for and what the chunk table's HNSW index is:
    ``configured``, ``dimensions`` (of the column), ``index`` (``"vector"``,
    ``"halfvec(n)"``, another operator class, or None when there is none) and ``matches``."""
    connection = connection or _connection()
    kind = vector_index_type()
    dimensions = vector_index.column_dimensions(connection, CHUNKS)
    found = vector_index.installed_index(connection)
    return {
        "configured": kind,
        "dimensions": dimensions,
        "index": found.describe() if found else None,
        "matches": found is not None and found.matches(kind, dimensions),
    }


def rebuild_index(connection=None) -> None:
    """Build the chunk vectors' HNSW index again, of the type ``VECTOR_INDEX_TYPE`` names.

    Outside a transaction the new index is built concurrently under another name while
    searches use the old one, then replaces it in a short transaction (writers and searches
    wait only for the drop and the rename); inside one (a migration), in place.
    """
    connection = connection or _connection()
    dimensions = vector_index.column_dimensions(connection, CHUNKS)
    if dimensions is None:
        raise LookupError(f"{CHUNKS}.embedding does not exist: run migrate first")
    concurrently = not connection.in_atomic_block
    build = _hnsw_sql(
        REBUILT_INDEX, "embedding", dimensions, concurrently=concurrently, connection=connection
    )
    with connection.cursor() as cursor:
        _flush_deferred_checks(cursor, connection)
        # A build that failed half-way (concurrently) leaves an invalid index of this name.
        cursor.execute(f"DROP INDEX {'CONCURRENTLY' if concurrently else ''} IF EXISTS "
                       f"{REBUILT_INDEX}")  # fmt: skip
        cursor.execute(build)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {vector_index.HNSW_INDEX}")
        cursor.execute(f"ALTER INDEX {REBUILT_INDEX} RENAME TO {vector_index.HNSW_INDEX}")


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

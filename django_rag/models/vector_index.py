"""The HNSW index of the chunk vectors, of the type ``VECTOR_INDEX_TYPE`` names.

``"vector"`` indexes the ``embedding`` column itself (``vector_cosine_ops``). ``"halfvec"``
indexes the expression ``embedding::halfvec(n)`` (``halfvec_cosine_ops``): the column stays
``vector`` (it stores up to 16,000 dimensions at full precision), the index holds 16-bit
floats, so it is about half the size and takes models of up to 4,000 dimensions where a
``vector`` index stops at 2,000. The planner uses an expression index only for a query ordered
by the same expression, so every ranking query orders by :func:`ranking_distance`.

One definition for every place that builds the index: the migration (:class:`EmbeddingIndex`
in the model's ``Meta.indexes``), the model switch's shadow index and ``rag_maintenance
vector-index`` (:func:`index_sql`); :func:`installed_index` reads what the database has.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Value
from django.db.models.functions import Cast
from pgvector.django import CosineDistance, HalfVectorField, HnswIndex

from ..conf import embedding_dimensions, vector_index_type
from ..exceptions import ConfigurationError

HNSW_INDEX = "django_rag_chunk_hnsw_idx"
# The index's build parameters (pgvector's defaults), for the model's index and every rebuild.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
OPCLASSES = {"vector": "vector_cosine_ops", "halfvec": "halfvec_cosine_ops"}
# halfvec (its type, casts and operator classes) came with pgvector 0.7.
MINIMUM_PGVECTOR = {"vector": (0, 5), "halfvec": (0, 7)}


def require_supported(kind: str, pgvector: tuple[int, ...]) -> None:
    """Raise :class:`ConfigurationError` when ``pgvector`` (the installed version; ``()``:
    unknown) has no ``kind`` index. E009 reports a pgvector too old for any index."""
    needed = MINIMUM_PGVECTOR[kind]
    if kind == "vector" or not pgvector or pgvector >= needed:
        return
    shown = ".".join(str(part) for part in pgvector)
    raise ConfigurationError(
        "VECTOR_INDEX_TYPE",
        kind,
        f"needs pgvector {'.'.join(map(str, needed))} or newer (the halfvec type); the "
        f"database has pgvector {shown}: upgrade pgvector on the server and run ALTER "
        "EXTENSION vector UPDATE; or set VECTOR_INDEX_TYPE back to 'vector'",
    )


def extension_version(connection) -> tuple[int, ...]:
    """The pgvector version installed in ``connection``'s database; ``()`` when it is not."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    if not row:
        return ()
    return tuple(int(part) for part in row[0].split(".") if part.isdigit())


def indexed_column(column: str, dimensions: int, kind: str) -> str:
    """The index's column list: ``column`` and its operator class, for ``kind``."""
    if kind == "halfvec":
        return f"({column}::halfvec({int(dimensions)})) {OPCLASSES[kind]}"
    return f"{column} {OPCLASSES[kind]}"


def index_sql(
    name: str,
    table: str,
    column: str,
    dimensions: int,
    *,
    kind: str,
    concurrently: bool = False,
) -> str:
    """``CREATE INDEX`` of an HNSW index of ``kind`` on ``column`` (``dimensions``: its size),
    with the model index's parameters."""
    options = f"m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}"
    return (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}{name} ON {table} "
        f"USING hnsw ({indexed_column(column, dimensions, kind)}) WITH ({options})"
    )


class EmbeddingIndex(HnswIndex):
    """The chunk vectors' HNSW index, of the type ``VECTOR_INDEX_TYPE`` names when it is
    created. Like :class:`~django_rag.models.fields.EmbeddingField`'s size, the type is not in
    the migration state: changing the setting never creates a migration; ``rag_maintenance
    vector-index`` rebuilds an existing index, and system check ``django_rag.W007`` reports
    one of another type."""

    def create_sql(self, model, schema_editor, using="", **kwargs):
        kind = vector_index_type()
        # A typed error naming the settings where pgvector would refuse the size.
        dimensions = embedding_dimensions()
        statement = super().create_sql(model, schema_editor, using=using, **kwargs)
        if kind == "vector":
            return statement
        require_supported(kind, extension_version(schema_editor.connection))
        (field,) = self.fields
        column = schema_editor.quote_name(model._meta.get_field(field).column)
        # Django builds the column list from fields; an expression index needs its own.
        statement.parts["columns"] = indexed_column(column, dimensions, kind)
        return statement


def vector_literal(vector: Sequence[float] | str) -> str:
    """The text of ``vector`` as pgvector reads it (``[x1,x2,...]``), each component with the
    nine significant digits that give back its single-precision value exactly (pgvector
    stores single precision): a query's vector is written once per search, in under half the
    time of the shortest double-precision form. A string is taken to be such a text already."""
    if isinstance(vector, str):
        return vector
    return "[" + ",".join(map("%.9g".__mod__, vector)) + "]"


def ranking_distance(vector: Sequence[float] | str, column: str = "embedding"):
    """The cosine distance a semantic search orders by: the one the index holds, so the
    planner can use it (``column::halfvec(n) <=> query::halfvec(n)`` for ``"halfvec"``, with
    ``n`` the query's size, which is the column's). ``vector``: as :func:`vector_literal`
    takes it."""
    literal = vector_literal(vector)
    if vector_index_type() == "vector":
        return CosineDistance(column, Value(literal))
    field = HalfVectorField(dimensions=literal.count(",") + 1)
    return CosineDistance(Cast(column, field), Cast(Value(literal), field))


@dataclass(frozen=True)
class IndexState:
    """The HNSW index the database has: its operator class and its definition."""

    opclass: str
    definition: str

    @property
    def kind(self) -> str:
        """``"vector"`` or ``"halfvec"`` (the operator class itself for any other)."""
        for kind, opclass in OPCLASSES.items():
            if self.opclass == opclass:
                return kind
        return self.opclass

    @property
    def dimensions(self) -> int | None:
        """The size a ``halfvec`` expression index casts to; None for a column index."""
        found = re.search(r"::halfvec\((\d+)\)", self.definition)
        return int(found.group(1)) if found else None

    def matches(self, kind: str, dimensions: int | None) -> bool:
        """Whether this is the index of ``kind`` a column of ``dimensions`` needs."""
        if self.kind != kind:
            return False
        return kind == "vector" or dimensions is None or self.dimensions == dimensions

    def describe(self) -> str:
        return f"halfvec({self.dimensions})" if self.kind == "halfvec" else self.kind


def installed_index(connection, name: str = HNSW_INDEX) -> IndexState | None:
    """The HNSW index ``name`` in ``connection``'s database, or None when it does not exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT opc.opcname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_opclass opc ON opc.oid = i.indclass[0] "
            "WHERE i.indexrelid = to_regclass(%s)",
            [name],
        )
        row = cursor.fetchone()
    return IndexState(*row) if row else None


def column_dimensions(connection, table: str, column: str = "embedding") -> int | None:
    """The size of the ``vector(n)`` column, or None when the column is missing (a missing
    table raises the database's error: the commands then say to run ``migrate``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
            [table, column],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    found = re.search(r"\((\d+)\)", row[0])
    return int(found.group(1)) if found else None

"""Chunk rows: what a stored chunk is made of (:class:`ChunkRow`) and inserting many of them in
few statements (binary ``COPY`` where the driver allows it).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import DatabaseError, connections
from django.db.backends.postgresql.psycopg_any import is_psycopg3
from django.utils import timezone

from ..conf import get_setting
from ..models import Chunk, Collection, Document
from ..models.databases import write_db
from ..models.fulltext import LENGTH_SQL
from .headers import indexed_sql


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


def inserted_chunk(document, collection, row: ChunkRow, model_name: str, pk: int) -> Chunk:
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
        inserted_chunk(document, collection, chunk, model_name, pk)
        for chunk, pk in zip(chunks, ids, strict=True)
    ]

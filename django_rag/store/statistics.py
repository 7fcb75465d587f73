"""The BM25 statistics: search vectors written with the chunks, deltas folded into the base rows.

Triggers record every change of the chunk table as appended delta rows (see
:mod:`django_rag.models.fulltext`); :func:`compact_statistics` folds them into
``django_rag_term`` / ``django_rag_corpus``. Only the compactor updates those rows, one at a
time (a transaction-level advisory lock), in term order, so writers never wait for each other
there and no lock cycle can form.
"""

from __future__ import annotations

from django.db import connections, transaction

from ..conf import get_setting
from ..models.fulltext import LENGTH_SQL, corpus_statistics

_COMPACT_LOCK = "django_rag:statistics:compact"


def compact_statistics(using: str = "default") -> bool:
    """Fold the pending statistics deltas into the base rows, in a transaction of its own.

    Returns False without waiting when another process is compacting (the deltas it did not
    see stay for the next run; readers count them either way).
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [_COMPACT_LOCK])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(
            """
            WITH moved AS (DELETE FROM django_rag_term_delta RETURNING term, delta),
            sums AS (SELECT term, sum(delta) AS n FROM moved GROUP BY term HAVING sum(delta) <> 0)
            INSERT INTO django_rag_term (term, document_frequency)
            SELECT term, n FROM sums ORDER BY term
            ON CONFLICT (term) DO UPDATE
            SET document_frequency = django_rag_term.document_frequency + EXCLUDED.document_frequency
            """
        )
        cursor.execute(
            """
            WITH moved AS (DELETE FROM django_rag_corpus_delta RETURNING chunk_count, total_length)
            INSERT INTO django_rag_corpus (id, chunk_count, total_length)
            SELECT 1, coalesce(sum(chunk_count), 0), coalesce(sum(total_length), 0) FROM moved
            ON CONFLICT (id) DO UPDATE SET
                chunk_count = django_rag_corpus.chunk_count + EXCLUDED.chunk_count,
                total_length = django_rag_corpus.total_length + EXCLUDED.total_length
            """
        )
        # Terms no chunk contains any more.
        cursor.execute("DELETE FROM django_rag_term WHERE document_frequency = 0")
    return True


def recount_statistics(using: str = "default") -> dict:
    """The statistics recounted from the chunk table and as stored (base rows plus deltas):
    ``{"recount": {...}, "stored": {...}}`` with ``chunks``, ``length`` and ``terms``
    (term -> document frequency). They are equal unless something bypassed the triggers."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(fts_length), 0) FROM django_rag_chunk "
            "WHERE search_vector IS NOT NULL"
        )
        chunks, length = cursor.fetchone()
        cursor.execute(
            "SELECT u.lexeme, count(*) FROM django_rag_chunk c, unnest(c.search_vector) u "
            "GROUP BY 1"
        )
        recount_terms = dict(cursor.fetchall())
        cursor.execute(
            "SELECT term, sum(n) FROM (SELECT term, document_frequency AS n FROM django_rag_term "
            "UNION ALL SELECT term, delta FROM django_rag_term_delta) s GROUP BY term "
            "HAVING sum(n) <> 0"
        )
        stored_terms = {term: int(n) for term, n in cursor.fetchall()}

    stored_chunks, stored_length = corpus_statistics(using)
    return {
        "recount": {"chunks": int(chunks), "length": int(length), "terms": recount_terms},
        "stored": {"chunks": stored_chunks, "length": stored_length, "terms": stored_terms},
    }


def search_vectors(
    texts: list[str], *, config: str | None = None, using: str = "default"
) -> list[tuple[str, int]]:
    """``(tsvector text, length)`` for each text, to store with new chunks in one INSERT."""
    if not texts:
        return []
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    sql = f"""
        SELECT v::text, {LENGTH_SQL.format(v="v")}
        FROM unnest(%s::text[]) WITH ORDINALITY AS t(text, n),
             to_tsvector(%s::regconfig, t.text) AS v
        ORDER BY t.n
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [texts, config])
        return [(vector, int(length)) for vector, length in cursor.fetchall()]


def index_chunks(*, document_id=None, config: str | None = None, using: str = "default") -> int:
    """(Re)compute ``search_vector`` and ``fts_length`` of a document's chunks, or of all chunks.

    Run it for every chunk after changing ``TEXT_SEARCH_CONFIG``; the statistics follow through
    the triggers. Returns the number of chunks updated.
    """
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    where, params = (
        ("WHERE document_id = %s", [config, document_id]) if document_id else ("", [config])
    )
    sql = f"""
        UPDATE django_rag_chunk c SET search_vector = s.vector, fts_length = s.length
        FROM (
            SELECT id, vector, {LENGTH_SQL.format(v="vector")} AS length
            FROM (SELECT id, to_tsvector(%s::regconfig, text) AS vector
                  FROM django_rag_chunk {where}) t
        ) s
        WHERE c.id = s.id
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount

"""The BM25 statistics: search vectors written with the chunks, deltas folded into the base rows.

Triggers record every change of the chunk table as appended delta rows, per collection (see
:mod:`django_rag.models.fulltext`); :func:`compact_statistics` folds them into
``django_rag_term`` / ``django_rag_corpus``. Only the compactor updates those rows, one at a
time (a transaction-level advisory lock), in term order, so writers never wait for each other
there and no lock cycle can form. Deleting a collection waits for that lock (see
:func:`django_rag.models.fulltext.delete_collection_statistics`) before its rows go.
"""

from __future__ import annotations

from collections import defaultdict

from django.db import connections, transaction

from ..conf import get_setting
from ..models.fulltext import LENGTH_SQL, STATISTICS_LOCK
from .headers import indexed_sql

_COMPACT_LOCK = STATISTICS_LOCK
# A chunk's frequency of the lexeme ``u`` (as BM25 counts it: a lexeme without positions once).
_TF = "coalesce(array_length(u.positions, 1), 1)"


def compact_statistics(using: str = "default") -> bool:
    """Fold the pending statistics deltas into the base rows, in a transaction of its own.

    Returns False without waiting when another process is compacting or a collection is being
    deleted (the deltas it did not see stay for the next run; readers count them either way).
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [_COMPACT_LOCK])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(
            """
            WITH moved AS (
                DELETE FROM django_rag_term_delta
                RETURNING collection_id, term, delta, max_tf, min_length
            ),
            sums AS (
                SELECT collection_id, term, sum(delta) AS n,
                       max(max_tf) AS max_tf, min(min_length) AS min_length
                FROM moved GROUP BY collection_id, term
                -- A chunk inserted and another deleted: the count is unchanged, the bounds
                -- may widen.
                HAVING sum(delta) <> 0 OR max(max_tf) IS NOT NULL
            ),
            folded AS (
                INSERT INTO django_rag_term
                    (term, collection_id, document_frequency, max_tf, min_length)
                SELECT term, collection_id, n, max_tf, min_length FROM sums
                ORDER BY term, collection_id
                ON CONFLICT (term, collection_id) DO UPDATE
                SET document_frequency =
                    django_rag_term.document_frequency + EXCLUDED.document_frequency,
                    max_tf = greatest(django_rag_term.max_tf, EXCLUDED.max_tf),
                    min_length = least(django_rag_term.min_length, EXCLUDED.min_length)
                RETURNING term, collection_id, document_frequency
            )
            SELECT term, collection_id FROM folded WHERE document_frequency = 0
            """
        )
        emptied = cursor.fetchall()
        if emptied:
            # Terms no chunk of the collection contains any more. Only rows this run changed
            # can have reached 0, so the table is not scanned.
            cursor.execute(
                "DELETE FROM django_rag_term t USING unnest(%s::text[], %s::bigint[]) AS e(term, c) "
                "WHERE t.term = e.term AND t.collection_id = e.c AND t.document_frequency = 0",
                [[term for term, _ in emptied], [pk for _, pk in emptied]],
            )
        cursor.execute(
            """
            WITH moved AS (
                DELETE FROM django_rag_corpus_delta
                RETURNING collection_id, chunk_count, total_length
            )
            INSERT INTO django_rag_corpus (collection_id, chunk_count, total_length)
            SELECT collection_id, sum(chunk_count), sum(total_length) FROM moved
            GROUP BY collection_id ORDER BY collection_id
            ON CONFLICT (collection_id) DO UPDATE SET
                chunk_count = django_rag_corpus.chunk_count + EXCLUDED.chunk_count,
                total_length = django_rag_corpus.total_length + EXCLUDED.total_length
            """
        )
        # Collections with no indexed chunk left (one row per collection: a small table).
        cursor.execute("DELETE FROM django_rag_corpus WHERE chunk_count = 0 AND total_length = 0")
    return True


def recount_statistics(using: str = "default") -> dict:
    """The statistics recounted from the chunk table and as stored (base rows plus deltas):
    ``{"recount": {...}, "stored": {...}, "bounds": {...}}``. ``recount`` and ``stored`` hold
    ``chunks``, ``length`` and ``terms`` (term -> document frequency) over the whole database,
    and ``collections``: the same three per collection id. They are equal unless something
    bypassed the triggers. ``bounds`` has ``recount`` and ``stored``, each
    ``{(collection id, term): (max tf, min length)}``: the stored ones may be looser after
    deletes (max tf >= the recount's, min length <= it), never tighter;
    :func:`recount_term_bounds` makes them equal."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT collection_id, count(*), coalesce(sum(fts_length), 0) FROM django_rag_chunk "
            "WHERE search_vector IS NOT NULL GROUP BY 1"
        )
        recount_corpus = cursor.fetchall()
        cursor.execute(
            "SELECT c.collection_id, u.lexeme, count(*), "
            f"max({_TF}), min(coalesce(c.fts_length, 0)) "
            "FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1, 2"
        )
        recount_terms = cursor.fetchall()
        cursor.execute(
            "SELECT collection_id, sum(chunk_count), sum(total_length) FROM ("
            "SELECT collection_id, chunk_count, total_length FROM django_rag_corpus "
            "UNION ALL SELECT collection_id, chunk_count, total_length "
            "FROM django_rag_corpus_delta) s GROUP BY 1 "
            "HAVING sum(chunk_count) <> 0 OR sum(total_length) <> 0"
        )
        stored_corpus = cursor.fetchall()
        cursor.execute(
            "SELECT collection_id, term, sum(n), max(max_tf), min(min_length) FROM ("
            "SELECT collection_id, term, document_frequency AS n, max_tf, min_length "
            "FROM django_rag_term "
            "UNION ALL SELECT collection_id, term, delta, max_tf, min_length "
            "FROM django_rag_term_delta) s "
            "GROUP BY 1, 2 HAVING sum(n) <> 0"
        )
        stored_terms = cursor.fetchall()
    return {
        "recount": _statistics(recount_corpus, [row[:3] for row in recount_terms]),
        "stored": _statistics(stored_corpus, [row[:3] for row in stored_terms]),
        "bounds": {
            "recount": {(pk, term): (tf, length) for pk, term, _, tf, length in recount_terms},
            "stored": {(pk, term): (tf, length) for pk, term, _, tf, length in stored_terms},
        },
    }


def recount_term_bounds(using: str = "default") -> int:
    """Fold the pending deltas, then set every term's stored bounds (max tf, min length) to
    what the chunks hold now, tightening those that deletes left loose. One compactor at a
    time: waits for a running one. Returns the number of base rows changed.

    Safe beside writers: a chunk committed after the recount's snapshot has its delta pending,
    folded later with greatest() / least()."""
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [_COMPACT_LOCK])
        compact_statistics(using)  # re-takes the lock this transaction holds
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE django_rag_term t SET max_tf = r.max_tf, min_length = r.min_length
                FROM (
                    SELECT c.collection_id, u.lexeme AS term, max({_TF}) AS max_tf,
                           min(coalesce(c.fts_length, 0)) AS min_length
                    FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1, 2
                ) r
                WHERE t.term = r.term AND t.collection_id = r.collection_id
                  AND (t.max_tf IS DISTINCT FROM r.max_tf
                       OR t.min_length IS DISTINCT FROM r.min_length)
                """
            )
            return cursor.rowcount


def _statistics(corpus, terms) -> dict:
    collections: dict = defaultdict(lambda: {"chunks": 0, "length": 0, "terms": {}})
    pooled: dict[str, int] = defaultdict(int)
    for pk, chunks, length in corpus:
        collections[pk]["chunks"], collections[pk]["length"] = int(chunks), int(length)
    for pk, term, n in terms:
        collections[pk]["terms"][term] = int(n)
        pooled[term] += int(n)
    return {
        "chunks": sum(c["chunks"] for c in collections.values()),
        "length": sum(c["length"] for c in collections.values()),
        "terms": {term: n for term, n in pooled.items() if n},
        "collections": dict(collections),
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
            FROM (SELECT id, to_tsvector(%s::regconfig, {indexed_sql()}) AS vector
                  FROM django_rag_chunk {where}) t
        ) s
        WHERE c.id = s.id
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount

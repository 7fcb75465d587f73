"""The impact-ordered posting lists (:mod:`django_rag.models.postings`): checking and
rebuilding them.

The chunk triggers add and remove postings with every write; compaction (one compactor at a
time) trims lists that grew past ``TRIM_AT`` (:func:`.statistics.trim_lists`);
:func:`check_postings` finds what breaks the lists' invariant and :func:`rebuild_postings`
rebuilds every list from the chunks (``rag_maintenance postings``).
"""

from __future__ import annotations

from django.db import connections, transaction

from ..models import postings
from ..models.fulltext import STATISTICS_LOCK
from ..models.postings import impact_sql
from .statistics import TF_SQL, compact_statistics

_IMPACT = impact_sql(TF_SQL, "coalesce(c.fts_length, 0)")
# Every (chunk, term) of the chunk table with its impact.
_ALL_POSTINGS = f"""
    SELECT c.id AS chunk_id, u.lexeme AS term, c.collection_id, {_IMPACT} AS impact,
           {TF_SQL} AS tf, coalesce(c.fts_length, 0) AS length
    FROM django_rag_chunk c, unnest(c.search_vector) u
"""


def check_postings(using: str = "default") -> dict[str, int]:
    """What breaks the lists' invariant, recounted from the chunks: ``missing`` (a chunk's
    posting above its term's floor that is not listed: a search could miss the chunk),
    ``stray`` (a listed posting whose chunk no longer holds the term in that collection) and
    ``wrong_impact`` (a listed posting whose impact, tf or length differs from the chunk's). All 0 unless
    something bypassed the triggers or edited the tables."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            WITH expected AS MATERIALIZED ({_ALL_POSTINGS})
            SELECT
                (SELECT count(*) FROM expected e
                 LEFT JOIN django_rag_term t
                    ON t.term = e.term AND t.collection_id = e.collection_id
                 WHERE e.impact > coalesce(t.impact_floor, 0)
                   AND NOT EXISTS (SELECT 1 FROM django_rag_posting p
                                   WHERE p.chunk_id = e.chunk_id AND p.term = e.term)),
                (SELECT count(*) FROM django_rag_posting p
                 WHERE NOT EXISTS (SELECT 1 FROM expected e
                                   WHERE e.chunk_id = p.chunk_id AND e.term = p.term
                                     AND e.collection_id = p.collection_id)),
                (SELECT count(*) FROM django_rag_posting p JOIN expected e
                    ON e.chunk_id = p.chunk_id AND e.term = p.term
                 WHERE abs(e.impact - p.impact) > 1e-9 * greatest(abs(e.impact), 1)
                    OR e.tf <> p.tf OR e.length <> p.length)
            """
        )
        missing, stray, wrong = cursor.fetchone()
    return {"missing": int(missing), "stray": int(stray), "wrong_impact": int(wrong)}


def rebuild_postings(using: str = "default") -> int:
    """Rebuild every posting list from the chunks: each (term, collection)'s best
    ``LIST_DEPTH`` postings, its floor the highest impact left out. Returns the number of
    postings listed.

    Writers wait while it runs (it locks the posting table against writes, readers go on) and
    it waits for a running compactor: a rebuild may lower a floor, which is only safe with no
    writer between reading the old floor and inserting."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [STATISTICS_LOCK])
        cursor.execute("LOCK TABLE django_rag_posting IN SHARE ROW EXCLUSIVE MODE")
        # Fold what is pending first, so that every term with chunks has its base row.
        compact_statistics(using, trim=False)
        cursor.execute("DELETE FROM django_rag_posting")
        cursor.execute(
            f"""
            CREATE TEMPORARY TABLE django_rag_ranked ON COMMIT DROP AS
            SELECT chunk_id, term, collection_id, impact, tf, length,
                   row_number() OVER (PARTITION BY term, collection_id
                                      ORDER BY impact DESC, chunk_id) AS rank
            FROM ({_ALL_POSTINGS}) a
            """
        )
        cursor.execute(
            "INSERT INTO django_rag_posting (chunk_id, term, collection_id, impact, tf, length) "
            "SELECT chunk_id, term, collection_id, impact, tf, length FROM django_rag_ranked "
            "WHERE rank <= %s",
            [postings.LIST_DEPTH],
        )
        listed = cursor.rowcount
        cursor.execute("UPDATE django_rag_term SET impact_floor = 0, listed = 0")
        cursor.execute(
            """
            UPDATE django_rag_term t SET impact_floor = coalesce(r.floor, 0), listed = r.listed
            FROM (
                SELECT term, collection_id,
                       max(impact) FILTER (WHERE rank > %s) AS floor,
                       count(*) FILTER (WHERE rank <= %s) AS listed
                FROM django_rag_ranked GROUP BY 1, 2
            ) r
            WHERE t.term = r.term AND t.collection_id = r.collection_id
            """,
            [postings.LIST_DEPTH, postings.LIST_DEPTH],
        )
        cursor.execute("DROP TABLE django_rag_ranked")
        # Terms no chunk holds any more kept their rows for their floors: gone with them now.
        cursor.execute("DELETE FROM django_rag_term WHERE document_frequency = 0")
    return listed

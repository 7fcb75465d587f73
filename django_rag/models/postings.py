"""Impact-ordered posting lists: how the plain-SQL full-text backend stops early at any size.

Beside the BM25 statistics (:mod:`~django_rag.models.fulltext`), every term of every collection
has a posting list in ``django_rag_posting``: the chunks containing it, each with an *impact*,
the BM25 tf part of the term in the chunk computed with fixed reference parameters
(:data:`REFERENCE_K1`, :data:`REFERENCE_B`, :data:`REFERENCE_LENGTH`), indexed in descending
order. A search reads each query term's best postings first and stops once the chunks it has
not read cannot beat its tenth result (:func:`unseen_bound`), so its cost follows the depth it
reads, not the number of chunks holding the term.

A list keeps only its best postings: once a list is longer than :data:`TRIM_AT`, compaction cuts
it to :data:`LIST_DEPTH` and raises the term's ``impact_floor`` (on its ``django_rag_term``
row) to the highest impact it removed. The invariant every reader relies on: **a chunk holding
the term whose posting is not in the list has an impact at most ``impact_floor``**. Writers keep
it by inserting a posting only when its impact is above the floor (the chunk triggers, in the
same statement as the statistics); compaction keeps it by removing only postings at or below the
floor it sets; deletes remove postings, which keeps it trivially. Floors never go down except in
:func:`django_rag.store.rebuild_postings`, which blocks writers while it rebuilds.

The reference parameters only order the lists; the search bounds what an unread posting can
score with the real ``BM25_K1``, ``BM25_B`` and average length (:func:`unseen_bound`), so any
settings stay exact. They are frozen into migration 0016's trigger: changing them here without a
migration that re-keys the lists would break the ordering the bound relies on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.db import connections, models

REFERENCE_K1 = 1.2
REFERENCE_B = 0.75
REFERENCE_LENGTH = 100.0
# The postings a list keeps after a trim, and the length past which compaction trims it.
LIST_DEPTH = 1000
TRIM_AT = 2 * LIST_DEPTH
# The bound is computed from the frontier widened by this much: PostgreSQL and Python may round
# the same impact differently in the last bits.
IMPACT_ROUNDING = 1e-9
# Past this many occurrences the bound stops looking (the tf part's growth is negligible there,
# and a tf above it is bounded by k1 + 1 below).
MAX_TF_SCANNED = 10_000


def impact_sql(tf: str, length: str) -> str:
    """SQL computing the impact of a term ``tf`` times in a chunk of ``length`` lexemes."""
    return (
        f"(({tf})::float8 * {REFERENCE_K1 + 1} / (({tf})::float8 + {REFERENCE_K1} * "
        f"({1 - REFERENCE_B} + {REFERENCE_B} * ({length})::float8 / {REFERENCE_LENGTH})))"
    )


def impact(tf: int, length: int) -> float:
    """:func:`impact_sql` in Python (tests and the bound)."""
    return (
        tf
        * (REFERENCE_K1 + 1)
        / (tf + REFERENCE_K1 * (1 - REFERENCE_B + REFERENCE_B * length / REFERENCE_LENGTH))
    )


def unseen_bound(
    frontier: float,
    *,
    k1: float,
    b: float,
    average_length: float,
    max_tf: int | None,
    min_length: int | None,
) -> float:
    """The most BM25's tf part (with ``k1``, ``b`` and ``average_length``) can be for a chunk
    whose posting of a term has an impact at most ``frontier``, given the term's largest tf and
    smallest chunk length (None: unknown).

    An impact at most ``frontier`` with ``tf`` occurrences means a length of at least
    ``shortest(tf)`` (the impact falls as the length grows); the real tf part grows with tf and
    falls with the length, so its largest value over such chunks is at one of the tf values
    1..max_tf, each at its shortest admissible length. Outside the formula's range (k1 < 0, b
    outside [0, 1], unknown max tf) it is the tf part's limit, k1 + 1."""
    if frontier <= 0:
        return 0.0
    if k1 < 0 or not 0 <= b <= 1 or max_tf is None or average_length <= 0:
        return k1 + 1 if k1 >= -1 else 0.0
    v = frontier * (1 + IMPACT_ROUNDING)
    floor_length = max(min_length or 0, 0)
    best = 0.0
    for tf in range(1, min(max(int(max_tf), 1), MAX_TF_SCANNED) + 1):
        # impact(tf, L) <= v  <=>  L >= REFERENCE_LENGTH * (tf (k1r+1)/v - tf - k1r(1-br)) / (k1r br)
        needed = (
            REFERENCE_LENGTH
            * (tf * (REFERENCE_K1 + 1) / v - tf - REFERENCE_K1 * (1 - REFERENCE_B))
            / (REFERENCE_K1 * REFERENCE_B)
        )
        length = max(needed, floor_length, 0.0)
        denominator = tf + k1 * (1 - b + b * length / average_length)
        part = tf * (k1 + 1) / denominator if denominator > 0 else k1 + 1
        best = max(best, min(part, k1 + 1))
    if max_tf > MAX_TF_SCANNED:
        best = k1 + 1
    return best if math.isfinite(best) else k1 + 1


@dataclass
class ListHeads:
    """What :func:`list_heads` read: one entry per posting (``chunks``, the index of its
    word in the query's ``terms``, its ``tf`` and chunk ``length``), and each word's
    ``frontiers``: every chunk holding the word that was not read has an impact at most that
    (0: none is left)."""

    chunks: np.ndarray
    term_index: np.ndarray
    tf: np.ndarray
    length: np.ndarray
    frontiers: list[float]


def list_heads(
    terms: list[str],
    depth: int,
    *,
    using: str = "default",
    collection_ids: Sequence[int] | None = None,
) -> ListHeads:
    """The best ``depth`` postings of each of ``terms`` in each collection of
    ``collection_ids`` (None: every collection), read in one statement (one snapshot, floors
    included), a row of arrays per word and collection."""
    scope, params = "", []
    if collection_ids is not None:
        scope, params = " AND collection_id = ANY(%s)", [[int(pk) for pk in collection_ids]]
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT q.term, q.floor, h.n, h.last, h.ids, h.tfs, h.lengths "
            "FROM (SELECT term, collection_id, max(floor) AS floor FROM ("
            "SELECT term, collection_id, impact_floor AS floor FROM django_rag_term "
            f"WHERE term = ANY(%s){scope} "
            "UNION ALL SELECT term, collection_id, 0 FROM django_rag_term_delta "
            f"WHERE term = ANY(%s){scope}) s GROUP BY 1, 2) q "
            "CROSS JOIN LATERAL (SELECT count(*) AS n, min(impact) AS last, "
            "array_agg(chunk_id) AS ids, array_agg(tf) AS tfs, array_agg(length) AS lengths "
            "FROM (SELECT chunk_id, impact, tf, length FROM django_rag_posting p "
            "WHERE p.term = q.term AND p.collection_id = q.collection_id "
            "ORDER BY p.impact DESC LIMIT %s) x) h",
            [list(terms), *params, list(terms), *params, int(depth)],
        )
        rows = cursor.fetchall()
    position = {term: i for i, term in enumerate(terms)}
    frontiers = [0.0] * len(terms)
    parts: list[tuple[list, int, list, list]] = []
    for term, floor, n, last, ids, tfs, lengths in rows:
        i = position[term]
        floor = float(floor or 0.0)
        # A full read may have left postings as good as its last one; a short one left only
        # postings at or below the floor.
        edge = max(float(last), floor) if n >= depth else floor
        frontiers[i] = max(frontiers[i], edge)
        if n:
            parts.append((ids, i, tfs, lengths))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return ListHeads(empty, empty, empty, empty, frontiers)
    return ListHeads(
        np.fromiter((pk for ids, _, _, _ in parts for pk in ids), dtype=np.int64),
        np.concatenate([np.full(len(ids), i, dtype=np.int64) for ids, i, _, _ in parts]),
        np.fromiter((tf for _, _, tfs, _ in parts for tf in tfs), dtype=np.float64),
        np.fromiter((x for _, _, _, lengths in parts for x in lengths), dtype=np.float64),
        frontiers,
    )


class Posting(models.Model):
    """A chunk holding a term, with the term's impact in it (see the module docstring)."""

    pk = models.CompositePrimaryKey("chunk_id", "term")
    # No foreign key: the chunk triggers delete a chunk's postings with it (a constraint would
    # make each posting row lock its chunk in the writers' hot path).
    chunk_id = models.BigIntegerField()
    term = models.TextField()
    collection = models.ForeignKey(
        "django_rag.Collection",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    impact = models.FloatField()
    # The term's frequency in the chunk and the chunk's length: a search computes the chunk's
    # exact share of the term from them, without reading the chunk.
    tf = models.SmallIntegerField()
    length = models.IntegerField()

    class Meta:
        db_table = "django_rag_posting"
        indexes = [
            models.Index(
                fields=["term", "collection", "-impact"], name="django_rag_posting_impact_idx"
            )
        ]

    def __str__(self) -> str:
        return f"{self.term} in chunk {self.chunk_id}: {self.impact:.3f}"

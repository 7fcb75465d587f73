"""Full-text top-k over the impact-ordered posting lists (:mod:`.postings`): a threshold
algorithm whose cost follows how deep it reads, not how many chunks hold the query's words.

Each round reads every query word's best ``depth`` postings in the searched collections (one
statement). A posting carries the word's tf in the chunk and the chunk's length, so the chunk's
exact share of that word is known without reading the chunk; what it could get from the words
whose lists it was not read in is bounded by those words' frontiers (:func:`.postings.unseen_bound`).
That gives each chunk read an upper bound, and a chunk not read at all a bound too (every word
at its frontier, plus every phrase boost). Chunks are then scored exactly (the same BM25 SQL as
every other path, with the queryset's filters), best upper bound first, a batch at a time,
until no chunk left unscored could reach the ``limit``-th exact score. The round's result
stands when that score is also above the bound of the chunks not read; otherwise the next
round reads four times deeper. The result is the exact top ``limit`` (ties by primary key), as
if every chunk were scored; usually a few dozen chunks are.

When a round reaches the end of a list that was trimmed (the rest of the word's chunks are only
known to be at or below its floor) and still cannot stop, the GIN index finishes the search:
only chunks holding a set of the query's words whose bounds reach the ``limit``-th score found
so far can enter (:func:`covering_hits`), and the index intersects those words' postings. When
that would take too many sets of words, it gives up (returns None) and the caller falls back to
MaxScore over the GIN index, which is always complete.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from ..conf import search_setting
from . import postings
from .postings import list_heads, unseen_bound

# The first round's depth per word and list (times `limit`, at least FIRST_DEPTH), and how much
# deeper each next round reads.
FIRST_DEPTH = 64
DEPTH_PER_RESULT = 8
DEPTH_GROWTH = 4
# Chunks scored exactly per statement (at least; 2 x limit when more), and how many batches'
# worth of chunks that could still enter make the next round read deeper instead.
SCORE_BATCH = 32
PENDING_LIMIT = 4


def _above(bound: float, score: float) -> bool:
    """Whether a chunk bounded by ``bound`` could reach ``score`` (with a hair for rounding:
    PostgreSQL and Python compute the same BM25 in different orders)."""
    return bound * (1 + 1e-9) + 1e-12 >= score


def impact_hits(
    scored,
    weights,
    boosts,
    limit: int,
    *,
    collection_ids: Sequence[int] | None = None,
) -> list[tuple[int, float]] | None:
    """``(pk, BM25)`` of the ``limit`` best chunks of ``scored`` (a queryset annotated with
    ``fulltext_score`` for ``weights`` and ``boosts``), found through the posting lists of the
    collections ``collection_ids`` (None: all; the queryset's chunks must be within them), or
    None when the lists cannot prove the result (see the module docstring)."""
    if limit <= 0 or not weights.terms:
        return None
    k1 = float(search_setting("BM25_K1"))
    b = float(search_setting("BM25_B"))
    average = weights.average_length
    scoring = weights.scoring()
    boost_total = sum(w for _, w in boosts)
    table = scored.model._meta.db_table
    batch_size = max(SCORE_BATCH, 2 * limit)
    weight_of = np.asarray(scoring, dtype=np.float64)

    exact: dict[int, float] = {}  # chunks scored, that pass the queryset's filters
    dropped: set[int] = set()  # chunks scored that do not
    depth = max(FIRST_DEPTH, DEPTH_PER_RESULT * limit)
    while True:
        heads = list_heads(weights.terms, depth, using=scored.db, collection_ids=collection_ids)
        frontiers = heads.frontiers
        rest = np.array(
            [
                weight
                * unseen_bound(
                    frontier,
                    k1=k1,
                    b=b,
                    average_length=average,
                    max_tf=weights.max_tf[i] if i < len(weights.max_tf) else None,
                    min_length=weights.min_length[i] if i < len(weights.min_length) else None,
                )
                for i, (weight, frontier) in enumerate(zip(scoring, frontiers, strict=True))
            ]
        )
        unread = float(rest.sum()) + boost_total
        # Each chunk read: its exact share of the words it was read under (BM25's tf part as
        # bm25_sql computes it, times the word's weight; a lower bound of its score), and that
        # plus the bound of the other words (an upper bound).
        chunks, index = np.unique(heads.chunks, return_inverse=True)
        tf, length, term = heads.tf, heads.length, heads.term_index
        share = weight_of[term] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))
        known = np.bincount(index, weights=share, minlength=len(chunks))
        upper = unread + known - np.bincount(index, weights=rest[term], minlength=len(chunks))
        # The likeliest first: the best known shares set the floor soonest.
        order = np.lexsort((chunks, -upper, -known))
        chunks, upper = chunks[order].tolist(), upper[order].tolist()
        deeper = any(frontiers) and depth <= postings.TRIM_AT + limit
        batches = 0
        while True:
            best = sorted(exact.items(), key=lambda hit: (-hit[1], hit[0]))[:limit]
            floor = best[-1][1] if len(best) == limit else float("-inf")
            pending = [
                chunk
                for chunk, bound in zip(chunks, upper, strict=True)
                if _above(bound, floor) and chunk not in exact and chunk not in dropped
            ]
            # Too many chunks could still enter: reading deeper tightens their bounds for less
            # than scoring them all (once a batch has set a floor).
            if not pending or (batches and deeper and len(pending) > PENDING_LIMIT * batch_size):
                break
            batch = pending[:batch_size]
            found = dict(
                scored.filter(
                    RawSQL(f"{table}.id = ANY(%s::bigint[])", [batch], output_field=BooleanField())
                ).values_list("pk", "fulltext_score")
            )
            exact.update(found)
            dropped.update(chunk for chunk in batch if chunk not in found)
            batches += 1
        if not pending:
            if not any(frontiers):
                return best  # every chunk holding a query word was read
            # Strictly above: a chunk not read scoring as much could tie and come first by pk.
            if len(best) == limit and not _above(unread, best[-1][1]):
                return best
        if not deeper:
            # Past any trimmed list's length: what is left is only bounded by the floors.
            return covering_hits(scored, weights, boosts, best, limit)
        depth *= DEPTH_GROWTH


def covering_hits(scored, weights, boosts, best, limit: int) -> list[tuple[int, float]] | None:
    """The top ``limit`` among the chunks that hold a set of query words able to reach the
    ``limit``-th score found so far (``best``): every chunk scoring as much holds such a set
    (``TermWeights.covering``), so the result is exact. None when too few chunks were found to
    set that score, or too many sets would be needed."""
    if len(best) < limit:
        return None
    query = weights.covering(best[-1][1], boosts)
    if query is None:
        return None
    return list(
        scored.matching(query)
        .order_by("-fulltext_score", "pk")
        .values_list("pk", "fulltext_score")[:limit]
    )

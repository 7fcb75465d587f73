"""Full-text top-k over the impact-ordered posting lists (:mod:`.postings`): a threshold
algorithm whose cost follows how deep it reads, not how many chunks hold the query's words.

Each round reads every query term's best ``depth`` postings in the searched collections (one
statement), scores the chunks it has not scored yet exactly (the same BM25 SQL as every other
path, with the queryset's filters), and stops when the ``limit``-th score is above what any
chunk it has not read could score: the sum, over the terms, of the term's weight times the most
its tf part can be at the term's frontier (:func:`.postings.unseen_bound`), plus every phrase
boost. Otherwise it reads four times deeper. The result is the exact top ``limit`` (ties by
primary key), the same as scoring every chunk.

When a round reaches the end of a list that was trimmed (the rest of the term's chunks are only
known to be at or below its floor) and still cannot stop, it gives up (returns None) and the
caller falls back to MaxScore over the GIN index, which is always complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from ..conf import search_setting
from . import postings
from .postings import list_heads, unseen_bound

# The first round's depth per term and list (times `limit`, at least FIRST_DEPTH), and how much
# deeper each next round reads.
FIRST_DEPTH = 64
DEPTH_PER_RESULT = 8
DEPTH_GROWTH = 4


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
    scoring = weights.scoring()
    boost_total = sum(w for _, w in boosts)
    table = scored.model._meta.db_table
    depth = max(FIRST_DEPTH, DEPTH_PER_RESULT * limit)
    seen: set[int] = set()
    best: list[tuple[int, float]] = []
    while True:
        heads = list_heads(weights.terms, depth, using=scored.db, collection_ids=collection_ids)
        new = sorted({pk for ids, _ in heads.values() for pk in ids} - seen)
        if new:
            seen.update(new)
            found = (
                scored.filter(
                    RawSQL(f"{table}.id = ANY(%s::bigint[])", [new], output_field=BooleanField())
                )
                .order_by("-fulltext_score", "pk")
                .values_list("pk", "fulltext_score")[:limit]
            )
            best = sorted([*best, *found], key=lambda hit: (-hit[1], hit[0]))[:limit]
        frontiers = [heads[term][1] for term in weights.terms]
        if not any(frontiers):
            return best  # every chunk holding a query word was read and scored
        bound = sum(
            weight
            * unseen_bound(
                frontier,
                k1=k1,
                b=b,
                average_length=weights.average_length,
                max_tf=weights.max_tf[i] if i < len(weights.max_tf) else None,
                min_length=weights.min_length[i] if i < len(weights.min_length) else None,
            )
            for i, (weight, frontier) in enumerate(zip(scoring, frontiers, strict=True))
        )
        bound = (bound + boost_total) * (1 + 1e-9) + 1e-12
        # Strictly above: an unread chunk scoring as much could tie and come first by pk.
        if len(best) == limit and best[-1][1] > bound:
            return best
        if depth > postings.TRIM_AT + limit:
            # Past any trimmed list's length: what is left is only bounded by the floors.
            return None
        depth *= DEPTH_GROWTH

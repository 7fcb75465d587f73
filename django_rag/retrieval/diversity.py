"""Diversity: maximal marginal relevance (MMR) over a search's best candidates.

``search(..., diversity=d)`` fetches ``candidates x limit`` results as usual, then picks
``limit`` of them one at a time: each pick is the candidate with the highest

    (1 - d) * relevance - d * (its highest cosine similarity to a chunk already picked)

where relevance is the candidate's score (its reranker score when a reranker ran) divided
by the best candidate's (min-max scaled when a score is negative: the full-text and hybrid
scores have no fixed range) and similarity is the cosine between the chunks' stored
embeddings. ``d = 0`` keeps the ranking; larger values trade relevance for chunks that say
something the earlier ones did not (a near-duplicate chunk, an overlapping window, another
copy of the same page). The first pick is always the most relevant candidate.

Carbonell and Goldstein, "The use of MMR, diversity-based reranking for reordering documents
and producing summaries" (SIGIR 1998).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..models import Chunk


def mmr_order(
    relevance: Sequence[float], vectors: np.ndarray, limit: int, diversity: float
) -> list[int]:
    """Indexes of the ``limit`` candidates MMR picks, in pick order. The candidates come best
    first (the caller's ranking: retrieval, or a reranker's); ``relevance`` is one number per
    candidate (any scale), ``vectors`` one unit-length row per candidate (a zero row: a chunk
    without an embedding, similar to nothing). The first pick is the first candidate; a tie
    goes to the earlier one."""
    count = len(relevance)
    if count == 0 or limit <= 0:
        return []
    scaled = _relevance(np.asarray(relevance, dtype=float))
    similarity = vectors @ vectors.T
    picked = [0]
    closest = similarity[0].copy()  # each candidate's highest similarity to a pick
    available = np.ones(count, dtype=bool)
    available[0] = False
    while len(picked) < min(limit, count):
        value = (1.0 - diversity) * scaled - diversity * closest
        value[~available] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        available[best] = False
        np.maximum(closest, similarity[best], out=closest)
    return picked


def _relevance(scores: np.ndarray) -> np.ndarray:
    """Scores on 0..1: divided by the best when none is negative (their ratios kept: a
    candidate half as relevant counts half), else min-max scaled; a missing (NaN) score is
    the lowest."""
    scores = np.nan_to_num(scores, nan=np.nanmin(scores) if np.isfinite(scores).any() else 0.0)
    low, high = scores.min(), scores.max()
    if low >= 0 and high > 0:
        return scores / high
    return (scores - low) / (high - low) if high > low else np.ones(len(scores))


def diversify(results: list, limit: int, diversity: float, *, using: str) -> list:
    """``limit`` of ``results`` (best first, as a search or a reranker returns them) picked by
    :func:`mmr_order` on their ``rerank_score`` when reranked, else their ``score``, with the
    chunks' embeddings read from ``using`` in one query."""
    if diversity <= 0 or len(results) <= 1:
        return results[:limit]
    ids = [result.chunk_id for result in results]
    stored = dict(Chunk.objects.using(using).filter(pk__in=ids).values_list("pk", "embedding"))
    dimensions = next((len(v) for v in stored.values() if v is not None), 1)
    vectors = np.zeros((len(results), dimensions))
    for row, chunk_id in enumerate(ids):
        vector = stored.get(chunk_id)
        if vector is not None:
            vector = np.asarray(vector, dtype=float)
            norm = np.linalg.norm(vector)
            if norm > 0:
                vectors[row] = vector / norm
    # A reranker's order and scores when it ran (its results come first, scored).
    reranked = any(result.rerank_score is not None for result in results)
    relevance = [(result.rerank_score if reranked else result.score) for result in results]
    relevance = [np.nan if value is None else value for value in relevance]
    order = mmr_order(relevance, vectors, limit, diversity)
    return [results[index] for index in order]

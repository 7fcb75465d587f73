"""Diversity: maximal marginal relevance (MMR) over a search's best candidates.

``search(..., diversity=d)`` fetches ``candidates x limit`` results as usual, then picks
``limit`` of them one at a time: each pick is the candidate with the highest

    (1 - d) * relevance - d * (its highest cosine similarity to a chunk already picked)

where relevance is the candidate's score divided by the best candidate's (min-max scaled
when a score is negative: the full-text and hybrid scores have no fixed range) and similarity
is the cosine between the chunks' stored embeddings. ``d = 0`` keeps the ranking; larger values trade relevance for chunks that say
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
    """Indexes of the ``limit`` candidates MMR picks, in pick order. ``relevance`` is one
    number per candidate (any scale), ``vectors`` one unit-length row per candidate (a zero
    row: a chunk without an embedding, similar to nothing). Ties go to the earlier candidate."""
    count = len(relevance)
    if count == 0 or limit <= 0:
        return []
    raw = np.asarray(relevance, dtype=float)
    # Candidates in relevance order (stable): a tie, or two scores scaling to the same value,
    # goes to the more relevant, then the earlier, candidate.
    ranked = np.array(sorted(range(count), key=lambda i: (-raw[i], i)))
    scores = raw[ranked]
    scaled = _relevance(scores)
    unit = vectors[ranked]
    similarity = unit @ unit.T
    picked = [0]  # the most relevant candidate
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
    return [int(ranked[position]) for position in picked]


def _relevance(scores: np.ndarray) -> np.ndarray:
    """Scores (best first) on 0..1: divided by the best when none is negative (their ratios
    kept: a candidate half as relevant counts half), else min-max scaled."""
    low, high = scores[-1], scores[0]
    if low >= 0 and high > 0:
        return scores / high
    return (scores - low) / (high - low) if high > low else np.ones(len(scores))


def diversify(results: list, limit: int, diversity: float, *, using: str) -> list:
    """``limit`` of ``results`` (best first, as a search returns them) picked by
    :func:`mmr_order`, with the chunks' embeddings read from ``using`` in one query."""
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
    order = mmr_order([result.score for result in results], vectors, limit, diversity)
    return [results[index] for index in order]

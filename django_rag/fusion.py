"""Fusion of ranked lists: semantic and full-text scores (hybrid mode, in every store) and
reciprocal rank fusion of whole rankings (rewritten queries, graph results)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .exceptions import InvalidOption
from .validation import clean_number

FUSIONS = ("adaptive", "weighted", "rrf")


def fuse(
    items: Sequence[Any],
    *,
    fusion: str = "rrf",
    rrf_k: int = 60,
    semantic_weight: float = 0.5,
    fulltext_weight: float = 0.5,
    keyword_score_floor: float = 0.0,
    pool: int | None = None,
    readable: bool = False,
) -> list[Any]:
    """Set ``item.score`` from ``item.semantic_score`` and ``item.fulltext_score``; sort.

    ``items`` are the union of each side's candidate list (the ``pool`` best by each score;
    None: all of them), with both scores computed for every item.

    ``adaptive``: a convex combination whose weights follow each query's evidence. Each side's
    score is standardised against its own candidate list (``(x - mean) / std``, so a score
    says how far a chunk stands out from what that side found); the weights are
    ``semantic_weight`` and ``fulltext_weight`` each multiplied by how clearly that side's
    best candidate stands out of its list (``(best - mean) / best``), then normalised to sum
    to 1. A side whose scores are flat for this query (no candidate is clearly better than
    the rest, as when only common words matched) counts for less; one with a clear winner
    counts for more.
    ``rrf``: reciprocal rank fusion, ``sum(1 / (rrf_k + rank))`` over the two rankings of the
    candidates (a chunk with no full-text match has no full-text rank and gets nothing from it).
    ``weighted``: ``semantic_weight * s + fulltext_weight * f`` where ``s`` is the cosine
    similarity min-max normalised over the candidates and ``f`` is BM25 divided by the best
    BM25 among them or ``keyword_score_floor``, whichever is larger (BM25's own minimum is 0),
    so both lie in [0, 1]; the floor keeps a weak full-text side weak (only words in nearly
    every chunk matched) instead of stretching its best to 1.
    Ties keep the semantic order.

    ``readable=True`` (what searches return) then puts each score on a scale a person can read,
    without changing the order: see :func:`readable_score`.
    """
    if fusion not in FUSIONS:
        raise InvalidOption(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    items = sorted(items, key=lambda item: -item.semantic_score)
    if not items:
        return []
    if fusion == "adaptive":
        words_matched = _adaptive(items, semantic_weight, fulltext_weight, pool or len(items))
        if readable and not words_matched:
            # The semantic order stands; on the readable scale, as standard scores like the
            # fused ones (the raw score, a cosine, can be negative).
            reference = [item.semantic_score for item in items[: pool or len(items)]]
            values = [item.semantic_score for item in items]
            for item, z in zip(items, _standardise(values, reference), strict=True):
                item.score = z
    elif fusion == "rrf":
        clean_number("rrf_k", rrf_k, minimum=0)
        for rank, item in enumerate(items, start=1):
            item.score = 1.0 / (rrf_k + rank)
        matched = sorted(
            (item for item in items if item.fulltext_score > 0),
            key=lambda item: -item.fulltext_score,
        )
        for rank, item in enumerate(matched, start=1):
            item.score += 1.0 / (rrf_k + rank)
    else:
        _check_weights(semantic_weight, fulltext_weight)
        high = items[0].semantic_score
        low = items[-1].semantic_score
        spread = high - low
        clean_number("keyword_score_floor", keyword_score_floor, minimum=0)
        best_fulltext = max(max(item.fulltext_score for item in items), keyword_score_floor)
        for item in items:
            s = (item.semantic_score - low) / spread if spread > 0 else 1.0
            f = item.fulltext_score / best_fulltext if best_fulltext > 0 else 0.0
            item.score = semantic_weight * s + fulltext_weight * f
    ranked = sorted(items, key=lambda item: -item.score)
    if readable:
        # After the sort: the order is the raw scores', whatever rounding does at the ends.
        for item in ranked:
            item.score = readable_score(
                item.score,
                fusion=fusion,
                semantic_weight=semantic_weight,
                fulltext_weight=fulltext_weight,
            )
    return ranked


def readable_score(
    score: float, *, fusion: str, semantic_weight: float = 0.5, fulltext_weight: float = 0.5
) -> float:
    """A raw fused ``score`` on a scale from 0 to 1, by a map that keeps the order.

    ``adaptive``: the logistic function of the mix of standard scores, ``1 / (1 + e^-x)``: 0.5
    is a candidate as good as the average of this query's candidates, 0.73 one standard
    deviation above it, 0.95 three; it never reaches 0 or 1 (the raw mix, typically -2 to 4, was
    negative for every candidate below the average, and could be for the best hit too).
    ``weighted``: divided by ``semantic_weight + fulltext_weight``; 1 is the best candidate on
    both sides. ``rrf``: unchanged (already positive; at most ``2 / (rrf_k + 1)``, first on
    both sides).
    """
    if fusion == "adaptive":
        if score >= 0:
            return 1.0 / (1.0 + math.exp(-score))
        exp = math.exp(score)  # no overflow for very negative scores
        return exp / (1.0 + exp)
    if fusion == "weighted":
        total = semantic_weight + fulltext_weight
        return score / total if total > 0 else 0.0
    return score


def _check_weights(semantic_weight: float, fulltext_weight: float) -> None:
    for name, weight in (
        ("semantic_weight", semantic_weight),
        ("fulltext_weight", fulltext_weight),
    ):
        clean_number(name, weight, minimum=0)


def _standardise(values: list[float], reference: list[float]) -> list[float]:
    """``values`` as standard scores against ``reference`` (all 0 when it has no spread)."""
    if len(reference) < 2:
        return [0.0] * len(values)
    mean, spread = statistics.fmean(reference), statistics.pstdev(reference)
    return [(v - mean) / spread if spread > 0 else 0.0 for v in values]


def _standing_out(reference: list[float]) -> float:
    """How far the best score of a list stands out of it: (best - mean) / best, in [0, 1]."""
    best = max(reference, default=0.0)
    return (best - statistics.fmean(reference)) / best if best > 0 else 0.0


def _adaptive(items: list[Any], semantic_weight: float, fulltext_weight: float, pool: int) -> bool:
    """Set adaptive scores; False when nothing matched the words (the scores are cosines)."""
    _check_weights(semantic_weight, fulltext_weight)
    semantic = [item.semantic_score for item in items[:pool]]  # items come sorted by it
    fulltext = sorted((i.fulltext_score for i in items if i.fulltext_score > 0), reverse=True)
    fulltext = fulltext[:pool]
    if not fulltext:  # nothing matched the words: the semantic order stands
        for item in items:
            item.score = item.semantic_score
        return False
    s_weight = semantic_weight * _standing_out(semantic)
    f_weight = fulltext_weight * _standing_out(fulltext)
    if s_weight + f_weight <= 0:  # neither side stands out: the weights as given
        s_weight, f_weight = semantic_weight, fulltext_weight
    if s_weight + f_weight <= 0:  # both weights 0: an even mix
        s_weight = f_weight = 1.0
    share = s_weight / (s_weight + f_weight)
    s_scores = _standardise([item.semantic_score for item in items], semantic)
    f_scores = _standardise([item.fulltext_score for item in items], fulltext)
    for item, s, f in zip(items, s_scores, f_scores, strict=True):
        item.score = share * s + (1 - share) * f
    return True


def rrf_merge(
    rankings: Sequence[Sequence[Any]],
    *,
    rrf_k: int = 60,
    weights: Sequence[float] | None = None,
) -> list[Any]:
    """Merge several ranked lists of results into one by reciprocal rank fusion.

    Results are identified by ``chunk_id``; the first occurrence of a chunk is kept, with
    ``score`` set to ``sum(weight / (rrf_k + rank))`` over the lists that contain it.
    ``weights`` (one finite number >= 0 per list; default 1 each) say how much each list
    counts. A list of weight 0 takes no part: its results appear only if another list has
    them, so ``rrf_merge([a, b], weights=[1, 0])`` is ``rrf_merge([a])``.
    """
    clean_number("rrf_k", rrf_k, minimum=0)
    if weights is None:
        weights = [1.0] * len(rankings)
    else:
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
            raise InvalidOption(
                f"weights must be a list of numbers, one per ranking, got {weights!r}"
            )
        if len(weights) != len(rankings):
            raise InvalidOption(
                f"weights must have one number per ranking: {len(rankings)} rankings, "
                f"{len(weights)} weights"
            )
        for weight in weights:
            clean_number("weights", weight, minimum=0)
    merged: dict[Any, Any] = {}
    totals: dict[Any, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        if weight == 0:
            continue
        for rank, result in enumerate(ranking, start=1):
            merged.setdefault(result.chunk_id, result)
            totals[result.chunk_id] = totals.get(result.chunk_id, 0.0) + weight / (rrf_k + rank)
    for chunk_id, result in merged.items():
        result.score = totals[chunk_id]
    return sorted(merged.values(), key=lambda result: -result.score)

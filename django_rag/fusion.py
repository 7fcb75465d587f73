"""Fusion of ranked lists: semantic and full-text scores (hybrid mode, in every store) and
reciprocal rank fusion of whole rankings (rewritten queries, graph results)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .exceptions import InvalidOption
from .validation import clean_number

FUSIONS = ("rrf", "weighted")


def fuse(
    items: Sequence[Any],
    *,
    fusion: str = "rrf",
    rrf_k: int = 60,
    semantic_weight: float = 0.5,
    fulltext_weight: float = 0.5,
) -> list[Any]:
    """Set ``item.score`` from ``item.semantic_score`` and ``item.fulltext_score``; sort.

    ``rrf``: reciprocal rank fusion, ``sum(1 / (rrf_k + rank))`` over the two rankings of the
    candidates (a chunk with no full-text match has no full-text rank and gets nothing from it).
    ``weighted``: ``semantic_weight * s + fulltext_weight * f`` where ``s`` is the cosine
    similarity min-max normalised over the candidates and ``f`` is BM25 divided by the best
    BM25 among them (BM25's own minimum is 0), so both lie in [0, 1].
    Ties keep the semantic order.
    """
    if fusion not in FUSIONS:
        raise InvalidOption(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    items = sorted(items, key=lambda item: -item.semantic_score)
    if not items:
        return []
    if fusion == "rrf":
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
        for name, weight in (
            ("semantic_weight", semantic_weight),
            ("fulltext_weight", fulltext_weight),
        ):
            clean_number(name, weight, minimum=0)
        high = items[0].semantic_score
        low = items[-1].semantic_score
        spread = high - low
        best_fulltext = max(item.fulltext_score for item in items)
        for item in items:
            s = (item.semantic_score - low) / spread if spread > 0 else 1.0
            f = item.fulltext_score / best_fulltext if best_fulltext > 0 else 0.0
            item.score = semantic_weight * s + fulltext_weight * f
    return sorted(items, key=lambda item: -item.score)


def rrf_merge(rankings: Sequence[Sequence[Any]], *, rrf_k: int = 60) -> list[Any]:
    """Merge several ranked lists of results into one by reciprocal rank fusion.

    Results are identified by ``chunk_id``; the first occurrence of a chunk is kept, with
    ``score`` set to ``sum(1 / (rrf_k + rank))`` over the lists that contain it.
    """
    clean_number("rrf_k", rrf_k, minimum=0)
    merged: dict[Any, Any] = {}
    totals: dict[Any, float] = {}
    for ranking in rankings:
        for rank, result in enumerate(ranking, start=1):
            merged.setdefault(result.chunk_id, result)
            totals[result.chunk_id] = totals.get(result.chunk_id, 0.0) + 1.0 / (rrf_k + rank)
    for chunk_id, result in merged.items():
        result.score = totals[chunk_id]
    return sorted(merged.values(), key=lambda result: -result.score)

"""The reranker base class and the callable wrapper."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..results import SearchResult
from ..signals import span


def dedupe(results: Sequence[SearchResult]) -> list[SearchResult]:
    """Drop repeated chunks (same ``chunk_id``), keeping the first occurrence."""
    seen: set[Any] = set()
    unique = []
    for result in results:
        if result.chunk_id not in seen:
            seen.add(result.chunk_id)
            unique.append(result)
    return unique


class Reranker:
    """Base class: reorders search results by a relevance score of (query, text).

    Subclasses implement :meth:`score`, returning one number per result (or None to leave the
    results in their order, unscored). :meth:`rerank` deduplicates by chunk id, attaches
    ``rerank_score``, drops results under ``threshold``, sorts best first and keeps ``top_k``.
    """

    def __init__(self, *, top_k: int | None = None, threshold: float | None = None):
        self.top_k = top_k
        self.threshold = threshold

    @property
    def name(self) -> str:
        return type(self).__name__

    def preload(self) -> None:
        """Load a local model now rather than on the first call (``PRELOAD_MODELS``); the
        default does nothing (an API or function reranker has nothing to load)."""

    def score(self, query: str, results: list[SearchResult]) -> list[float | None] | None:
        raise NotImplementedError

    def rerank(
        self,
        query: str,
        results: Sequence[SearchResult],
        *,
        top_k: int | None = None,
        threshold: float | None = None,
    ) -> list[SearchResult]:
        top_k = self.top_k if top_k is None else top_k
        threshold = self.threshold if threshold is None else threshold
        results = dedupe(results)
        with span("rerank", reranker=self.name, query=query, candidates=len(results)) as s:
            if not results:
                s.set(kept=0)
                return []
            scores = self.score(query, results)
            if scores is None:
                kept = results
            else:
                if len(scores) != len(results):
                    raise ValueError(
                        f"{self.name}.score returned {len(scores)} scores for {len(results)} "
                        "results"
                    )
                scored = [
                    dataclasses.replace(result, rerank_score=float(value))
                    for result, value in zip(results, scores, strict=True)
                    if value is not None and (threshold is None or value >= threshold)
                ]
                scored.sort(key=lambda result: result.rerank_score, reverse=True)
                # Results the reranker could not score stay, after the scored ones.
                unscored = [
                    result for result, value in zip(results, scores, strict=True) if value is None
                ]
                kept = scored + unscored
            if top_k is not None:
                kept = kept[:top_k]
            s.set(kept=len(kept))
            return kept

    __call__ = rerank

    def __repr__(self) -> str:
        return f"<{self.name} top_k={self.top_k} threshold={self.threshold}>"


class CallableReranker(Reranker):
    """Wraps ``func(query, results)`` returning one score per result (or None per result)."""

    def __init__(self, func: Callable[[str, list[SearchResult]], Sequence[float | None]], **kw):
        super().__init__(**kw)
        self.func = func

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", "custom_function")

    def score(self, query: str, results: list[SearchResult]) -> list[float | None]:
        return list(self.func(query, results))

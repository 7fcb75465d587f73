"""The search modes as a table: for each :class:`~django_rag.modes.SearchMode`, what it needs
(the query's embedding, its words), how :class:`~django_rag.store.vector_stores.PgVectorStore`
runs it (a :class:`~django_rag.models.managers.ChunkQuerySet` method), how
:class:`~django_rag.store.vector_stores.MemoryVectorStore` ranks it, and what its score means.

No code dispatches on a mode with ``if``/``else``: a mode is looked up here, so a mode added to
:class:`SearchMode` without an entry fails at import (:func:`complete`), never runs as another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..exceptions import InvalidSearchMode
from ..fusion import FUSIONS, fuse
from ..modes import SearchMode
from ..results import SearchResult

T = TypeVar("T")

#: What ``score`` means in hybrid mode, per fusion (read by :func:`score_legend`).
FUSION_LEGENDS: dict[str, str] = {
    "rrf": (
        "reciprocal rank fusion: sum of 1/(rrf_k + rank) over the semantic and full-text "
        "rankings (at most 2/(rrf_k + 1), first in both)"
    ),
    "weighted": (
        "weighted: 0 to 1, the weighted mix of cosine and BM25 each scaled to its best "
        "candidate (1 = best on both)"
    ),
    "adaptive": (
        "0 to 1: 0.5 = as good as this query's average candidate, 0.73 = one standard "
        "deviation above it, 0.95 = three (compare within one search)"
    ),
}


def complete(table: Mapping[Any, T], name: str, modes: Iterable[Any] = SearchMode) -> dict:
    """``table`` as a dict, checked to have an entry for every one of ``modes`` and nothing
    else; raises ``TypeError`` naming the table and what is missing (at import: a new mode
    without an implementation fails loudly instead of running as another mode)."""
    wanted = list(modes)
    missing = [str(mode) for mode in wanted if mode not in table]
    extra = [str(key) for key in table if key not in wanted]
    if missing or extra:
        raise TypeError(
            f"{name} must have one entry per search mode: missing {missing or 'none'}, "
            f"unknown {extra or 'none'}"
        )
    return dict(table)


if set(FUSION_LEGENDS) != set(FUSIONS):  # a fusion added without saying what its score means
    raise TypeError(f"FUSION_LEGENDS must describe every fusion of {FUSIONS}")


def fusion_options(request) -> dict[str, Any]:
    """What :func:`~django_rag.fusion.fuse` reads of a hybrid request (the same in every
    store)."""
    return {
        "fusion": request.fusion,
        "rrf_k": request.rrf_k,
        "semantic_weight": request.semantic_weight,
        "fulltext_weight": request.fulltext_weight,
        "keyword_score_floor": request.keyword_score_floor,
    }


# --- PgVectorStore: one ChunkQuerySet method per mode --------------------------------------


def _pg_semantic(chunks, request, scope) -> list[SearchResult]:
    # The result columns come with the ranking (no Chunk objects, no second query).
    return chunks.semantic_results(request.vector, limit=request.limit, threshold=request.threshold)


def _pg_fulltext(chunks, request, scope) -> list[SearchResult]:
    return chunks.fulltext_results(
        request.query,
        limit=request.limit,
        threshold=request.threshold,
        syntax=request.syntax,
        statistics_from=scope,
    )


def _pg_hybrid(chunks, request, scope) -> list[SearchResult]:
    return chunks.hybrid_results(
        request.vector,
        request.query,
        limit=request.limit,
        threshold=request.threshold,
        candidates=request.candidates,
        syntax=request.syntax,
        statistics_from=scope,
        **fusion_options(request),
    )


# --- MemoryVectorStore: one ranking of the scored entries per mode --------------------------
# Each takes the entries in scope (``semantic_score``/``fulltext_score`` set as the mode needs),
# the ones whose words matched (index -> BM25) and the request; it sets ``score`` and sorts.


def _memory_semantic(results: dict[int, Any], matches, request) -> list[SearchResult]:
    ranked = sorted(results.values(), key=lambda r: -r.semantic_score)
    for result in ranked:
        result.score = result.semantic_score
    return ranked


def _memory_fulltext(results: dict[int, Any], matches, request) -> list[SearchResult]:
    ranked = sorted(
        (r for i, r in results.items() if i in matches), key=lambda r: -r.fulltext_score
    )
    for result in ranked:
        result.score = result.fulltext_score
    return ranked


def _memory_hybrid(results: dict[int, Any], matches, request) -> list[SearchResult]:
    pool = request.limit * request.candidates
    by_semantic = sorted(results.values(), key=lambda r: -r.semantic_score)[:pool]
    by_fulltext = sorted(
        (r for i, r in results.items() if i in matches), key=lambda r: -r.fulltext_score
    )[:pool]
    union = {r.chunk_id: r for r in [*by_semantic, *by_fulltext]}
    return fuse(list(union.values()), pool=pool, readable=True, **fusion_options(request))


@dataclass(frozen=True)
class ModeImplementation:
    """One search mode: what it needs and how each built-in store runs it."""

    #: Whether a search in this mode needs the query's embedding.
    uses_vector: bool
    #: Whether a search in this mode ranks by the query's words (BM25).
    uses_text: bool
    #: What ``score`` means; ``{fusion}`` is replaced by the fusion's own legend.
    legend: str
    #: PgVectorStore: ``(scoped chunk queryset, request, collection ids) -> results``.
    pg: Callable[..., list[SearchResult]]
    #: MemoryVectorStore: ``(entries in scope, word matches, request) -> ranked entries``.
    memory: Callable[..., list[SearchResult]]


#: The one table of search modes (every mode, nothing else: checked at import).
MODE_TABLE: dict[SearchMode, ModeImplementation] = complete(
    {
        SearchMode.SEMANTIC: ModeImplementation(
            uses_vector=True,
            uses_text=False,
            legend="score: cosine similarity to the query (1 = same meaning, 0 = unrelated)",
            pg=_pg_semantic,
            memory=_memory_semantic,
        ),
        SearchMode.FULLTEXT: ModeImplementation(
            uses_vector=False,
            uses_text=True,
            legend="score: BM25 (0 = no query word; no upper bound, compare within one search)",
            pg=_pg_fulltext,
            memory=_memory_fulltext,
        ),
        SearchMode.HYBRID: ModeImplementation(
            uses_vector=True,
            uses_text=True,
            legend="score: hybrid, {fusion}",
            pg=_pg_hybrid,
            memory=_memory_hybrid,
        ),
    },
    "MODE_TABLE",
)


def implementation(mode: Any) -> ModeImplementation:
    """The table's entry for ``mode`` (a mode, its name or an alias); a mode without one
    raises :class:`~django_rag.exceptions.InvalidSearchMode` (never another mode's)."""
    parsed = SearchMode.parse(mode)
    try:
        return MODE_TABLE[parsed]
    except KeyError:
        raise InvalidSearchMode(
            f"Search mode {str(parsed)!r} has no implementation in MODE_TABLE.", mode=mode
        ) from None


def score_legend(mode: Any, fusion: str) -> str:
    """One line saying what the scores of a search in ``mode`` (with ``fusion``) mean."""
    return implementation(mode).legend.format(fusion=FUSION_LEGENDS[fusion])

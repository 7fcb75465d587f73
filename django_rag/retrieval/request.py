"""The search request: one value object, built and checked once (:func:`build_request`), its
collection scope resolved to ids once (:func:`resolve_scope`), then passed down unchanged to
the stores, the graph search and the Loop (:mod:`django_rag.retrieval.service` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Unpack

from ..conf import search_setting
from ..exceptions import InvalidOption
from ..models.databases import search_db
from ..models.fulltext import SYNTAXES
from ..modes import ALIASES as _ALIASES
from ..modes import MODES as _MODES
from ..modes import SearchMode
from ..validation import (
    clean_collection_names,
    clean_int,
    clean_metadata,
    clean_number,
    clean_positive_int,
    clean_query,
    clean_source_id,
)
from .context import MAX_CONTEXT_WINDOW
from .fusion import FUSIONS
from .options import (
    RequestOptions,
    check_search_options,
    request_option_names,
    search_option_names,
)
from .stores import collection_scope

MODES = _MODES  # re-exported: the registry lives in django_rag.modes
MODE_ALIASES = {alias: mode.value for alias, mode in _ALIASES.items()}
MAX_LIMIT = 1000
# Hybrid fuses each side's top candidates x limit chunks: bounded so one call cannot ask the
# database for an unbounded pool (10**20 overflowed PostgreSQL's bigint LIMIT).
MAX_CANDIDATES = 100
# pgvector's own bounds for hnsw.ef_search.
MAX_EF_SEARCH = 1000


@dataclass(frozen=True)
class SearchRequest:
    """One search, built and validated once by :func:`build_request` and then only read: the
    stores, the graph search and the Loop receive it; a step that needs a variant (another
    query, a larger limit, the query's vector) makes one with :func:`dataclasses.replace`.

    ``collections`` are the names asked for (None: every collection); ``collection_ids`` their
    ids once resolved (:func:`resolve_scope`, one lookup per request), None until then."""

    query: str
    mode: SearchMode
    limit: int
    vector: tuple[float, ...] | list[float] | None = None
    threshold: float | None = None
    collections: tuple[str, ...] | None = None
    collection_ids: tuple[int, ...] | None = None
    source_id: str | None = None
    metadata: dict[str, Any] | None = None
    fusion: str = "rrf"
    rrf_k: int = 60
    semantic_weight: float = 0.5
    fulltext_weight: float = 0.5
    # Weighted fusion divides BM25 by max(best BM25 among the candidates, this floor).
    keyword_score_floor: float = 0.05
    candidates: int = 4
    syntax: str = "natural"
    # The HNSW candidate list of this search (None: SEARCH["HNSW_EF_SEARCH"]).
    hnsw_ef_search: int | None = None
    # Chunks each side of a hit returned with it as its context (0: none; retrieval.context).
    context_window: int = 0
    # Relevance traded for chunks unlike those ranked above them, 0 to 1 (retrieval.diversity).
    diversity: float = 0.0
    # The DATABASES alias the search reads (models.databases.search_db); None: resolve it then.
    database: str | None = None

    @property
    def scope_resolved(self) -> bool:
        """Whether the collections are known as ids (or none are named)."""
        return self.collections is None or self.collection_ids is not None


def resolve_scope(request: SearchRequest) -> SearchRequest:
    """``request`` with its collection ids read (one query; an unknown name raises
    :class:`~django_rag.exceptions.UnknownCollection`), or itself when already resolved."""
    if request.scope_resolved:
        return request
    return replace(request, collection_ids=tuple(collection_scope(request) or ()))


def normalize_mode(mode: str | None) -> SearchMode:
    """The :class:`SearchMode` ``mode`` names (None: ``SEARCH["MODE"]``)."""
    return SearchMode.parse(search_setting("MODE") if mode is None else mode)


def _number(name: str, value: Any, *, minimum: float = 0.0) -> Any:
    return clean_number(name, value, minimum=minimum)


def build_request(query: str, **options: Unpack[RequestOptions]) -> SearchRequest:
    """The :class:`SearchRequest` these options describe, every option checked (an unknown one
    raises :class:`~django_rag.exceptions.InvalidOption` naming it) and every default read
    from ``SEARCH`` (the collections are resolved later, by :func:`resolve_scope`, once the
    store is known: a store other than pgvector keeps its own collections)."""
    check_search_options(options, "search()", own=search_option_names() - request_option_names())

    def option(name: str, setting: str | None = None) -> Any:
        value = options.get(name)
        return search_setting(setting) if value is None and setting else value

    search_mode = normalize_mode(options.get("mode"))
    limit = option("limit", "LIMIT")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidOption(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    threshold = option("threshold")
    if threshold is not None:
        clean_number("threshold", threshold)
    query = clean_query(query)
    metadata = option("metadata")
    if metadata is not None:
        metadata = clean_metadata(metadata)
    source_id = clean_source_id(option("source_id")) or None
    fusion = option("fusion", "FUSION")
    if fusion not in FUSIONS:
        raise InvalidOption(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    candidates = option("candidates", "CANDIDATES")
    clean_positive_int("candidates", candidates, maximum=MAX_CANDIDATES)
    syntax = option("syntax", "SYNTAX")
    if syntax not in SYNTAXES:
        raise InvalidOption(f"syntax must be one of {', '.join(SYNTAXES)}, got {syntax!r}")
    hnsw_ef_search = option("hnsw_ef_search")
    if hnsw_ef_search is not None:
        clean_positive_int("hnsw_ef_search", hnsw_ef_search, maximum=MAX_EF_SEARCH)
    context_window = option("context_window", "CONTEXT_WINDOW")
    clean_int("context_window", context_window, minimum=0, maximum=MAX_CONTEXT_WINDOW)
    diversity = option("diversity", "DIVERSITY")
    clean_number("diversity", diversity, minimum=0.0, maximum=1.0)
    names = clean_collection_names(option("collection"))
    return SearchRequest(
        query=query,
        mode=search_mode,
        limit=limit,
        threshold=threshold,
        collections=None if names is None else tuple(names),
        source_id=source_id,
        metadata=metadata,
        fusion=fusion,
        rrf_k=_number("rrf_k", option("rrf_k", "RRF_K")),
        semantic_weight=_number("semantic_weight", option("semantic_weight", "SEMANTIC_WEIGHT")),
        fulltext_weight=_number("fulltext_weight", option("fulltext_weight", "FULLTEXT_WEIGHT")),
        keyword_score_floor=float(
            _number("keyword_score_floor", option("keyword_score_floor", "KEYWORD_SCORE_FLOOR"))
        ),
        candidates=candidates,
        syntax=syntax,
        hnsw_ef_search=hnsw_ef_search,
        context_window=context_window,
        diversity=float(diversity),
        database=search_db(option("database")),
    )

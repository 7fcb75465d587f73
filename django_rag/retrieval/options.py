"""The search options, declared once: typed dicts for signatures (a type checker catches a
misspelled option at the call site), read at run time for the names they declare.

:class:`RequestOptions` describe the search (each is a field of
:class:`~django_rag.retrieval.request.SearchRequest`, tests/test_search_options.py keeps the
two equal); :class:`SearchComponents` are the parts that run it (reranker, rewriter, graph,
embedder, store); :class:`SearchOptions` are both, what :func:`~django_rag.search`,
:func:`~django_rag.ask` and :func:`~django_rag.chat` take as ``**options``;
:class:`AgentSearchOptions` are those less the :class:`ScopeOptions` an agent sets itself. Every option may be
None: the ``SEARCH`` setting (or the component's setting) then applies.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ..exceptions import InvalidOption


class ScopeOptions(TypedDict, total=False):
    """How many chunks, how good, from where: what :class:`~django_rag.Agent` and
    :class:`~django_rag.agent.Loop` take as arguments of their own (they set them on each of
    their searches)."""

    limit: int | None
    threshold: float | None
    collection: str | Sequence[str] | None


class RankingOptions(TypedDict, total=False):
    """The rest of what a search asks for (docs/search.md, "Options")."""

    mode: str | None
    source_id: str | None
    metadata: dict[str, Any] | None
    fusion: str | None
    rrf_k: float | None
    semantic_weight: float | None
    fulltext_weight: float | None
    keyword_score_floor: float | None
    candidates: int | None
    syntax: str | None
    hnsw_ef_search: int | None
    context_window: int | None
    diversity: float | None
    database: str | None


class RequestOptions(ScopeOptions, RankingOptions, total=False):
    """What a search asks for: the fields of
    :class:`~django_rag.retrieval.request.SearchRequest`."""


class SearchComponents(TypedDict, total=False):
    """The parts a search runs with, each an instance, alias, dotted path or function (None:
    its setting)."""

    reranker: Any
    rewriter: Any
    graph: bool | None
    graph_depth: int | None
    entity_matcher: Any
    graph_store: Any
    embedder: Any
    vector_store: Any


class SearchOptions(RequestOptions, SearchComponents, total=False):
    """Every keyword option of :func:`~django_rag.search`."""


class AgentSearchOptions(RankingOptions, SearchComponents, total=False):
    """The search options an agent passes to its searches: all but :class:`ScopeOptions`,
    which :class:`~django_rag.Agent` and :class:`~django_rag.agent.Loop` take themselves."""


@functools.cache
def request_option_names() -> frozenset[str]:
    """The options that describe the request, not its components."""
    return frozenset(RequestOptions.__annotations__)


@functools.cache
def search_option_names() -> frozenset[str]:
    """Every keyword option :func:`~django_rag.search` takes."""
    return frozenset(SearchOptions.__optional_keys__)


def check_search_options(
    options: Mapping[str, Any], owner: str, *, own: frozenset[str] = frozenset()
) -> None:
    """Raise :class:`~django_rag.exceptions.InvalidOption` naming the first of ``options``
    that :func:`~django_rag.search` does not take, with a suggestion and the accepted ones, so
    a typo fails at the call site of ``owner`` (``"search()"``, ``"ask()"``, ``"Loop"``...)
    before any work. ``own`` are names ``owner`` sets itself: they are refused too."""
    known = search_option_names() - own
    for name in options:
        if name in known:
            continue
        if name in ("collection", "collections"):
            hint = f"; give the collections as {owner}(collection=...) (a name or a list)"
        elif name == "strict_collections":
            hint = (
                "; searches are always strict (an unknown collection raises "
                "UnknownCollection), so leave it out"
            )
        else:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidOption(
            f"{owner} got an unknown option {name!r}{hint} (search options: "
            f"{', '.join(sorted(known))})"
        )


def split_options(
    options: Mapping[str, Any], owner: str = "search()"
) -> tuple[RequestOptions, SearchComponents]:
    """``options`` checked (:func:`check_search_options`) and split into what goes to
    :func:`~django_rag.retrieval.request.build_request` and the components."""
    check_search_options(options, owner)
    names = request_option_names()
    request: dict[str, Any] = {k: v for k, v in options.items() if k in names}
    components: dict[str, Any] = {k: v for k, v in options.items() if k not in names}
    return request, components  # type: ignore[return-value]

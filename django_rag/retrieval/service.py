"""The search service."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Unpack

from ..conf import graph_number, graph_setting, scrub_text, search_setting
from ..embeddings import active_dimensions, get_embedder
from ..exceptions import (
    ConfigurationError,
    EmbeddingFailed,
    InvalidInput,
    InvalidOption,
    LLMResponseError,
    RagError,
)
from ..graph.search import GraphMatch, graph_results
from ..llm.component import Component
from ..models.databases import search_db
from ..rerankers import get_reranker
from ..results import SearchResult
from ..signals import span
from ..store.search_modes import implementation
from ..utils import call_arity
from ..validation import check_query_vector, clean_query, rejects_unknown_options
from .aliases import accepts_aliases
from .context import with_context
from .diversity import diversify
from .fusion import rrf_merge
from .options import (  # noqa: F401 (check_search_options: re-exported)
    SearchComponents,
    SearchOptions,
    check_search_options,
    split_options,
)
from .request import (  # noqa: F401 (re-exported: the request's names are importable from here)
    MAX_CANDIDATES,
    MAX_EF_SEARCH,
    MAX_LIMIT,
    MODE_ALIASES,
    MODES,
    SearchRequest,
    build_request,
    normalize_mode,
    resolve_scope,
)
from .rewriters import get_rewriter
from .stores import PgVectorStore, get_vector_store, scoped_chunks


@accepts_aliases("search()")
def search(query: str, **options: Unpack[SearchOptions]) -> list[SearchResult]:
    """Search the stored chunks and return the best ``limit`` as :class:`SearchResult`.

    Modes: ``semantic`` (cosine similarity of embeddings), ``fulltext`` (BM25 over PostgreSQL
    text search) and ``hybrid`` (both, fused with ``fusion="adaptive"``, ``"weighted"`` or
    ``"rrf"``, see :func:`django_rag.fusion.fuse`). ``collection`` is a name or a list of names (None searches every
    collection; an unknown name raises :class:`~django_rag.exceptions.UnknownCollection`);
    ``metadata`` keeps chunks whose document metadata contains the given dict. ``threshold``
    is a minimum on ``score``: cosine similarity in semantic mode, BM25 in full-text mode, the
    fused score in hybrid mode. Options left as None take their ``SEARCH`` setting. The
    options are :class:`~django_rag.retrieval.options.SearchOptions` (a type checker reports a
    misspelled one); at run time an unknown one raises
    :class:`~django_rag.exceptions.InvalidOption` naming it, with the closest option.

    ``syntax`` says how full-text (and hybrid) mode reads the query: ``"natural"`` (default)
    treats it as a question, where quotes and minus signs never filter (a quoted phrase only
    boosts the chunks holding it); ``"websearch"`` makes ``"phrases"`` required and ``-word``
    excluded.

    ``reranker`` (a reranker, alias such as ``"cross-encoder"``, or scoring function; default
    ``DJANGO_RAG["RERANKER"]``, ``False`` for none) reorders ``RERANK_CANDIDATES x limit``
    candidates and keeps ``limit``; its own threshold is separate from ``threshold``.
    ``rewriter`` (``"rewrite"``, ``"expand"``, ``"keywords"``, ``"decompose"`` or a function
    ``query -> str | list[str]``) rewrites the query first; several queries are searched
    and merged by reciprocal rank fusion. Reranking always scores against the original query.

    ``graph=True`` (default ``GRAPH["ENABLED"]``) also finds the query's entities
    (``entity_matcher``), follows their relationships ``graph_depth`` hops, scores the chunks
    that mention them (within the same collection, source and metadata scope) and fuses them
    with the results above by reciprocal rank fusion, the graph list weighing
    ``GRAPH["WEIGHT"]`` (``graph_score`` is set on them). When no entity matched with a score
    of at least ``GRAPH["MIN_MATCH_SCORE"]``, the graph list is left out. ``graph_store``
    (default ``GRAPH["STORE"]``) is the graph store it reads (docs/graphrag.md).

    ``hnsw_ef_search`` (1 to 1000; default ``SEARCH["HNSW_EF_SEARCH"]``) is the HNSW
    candidate list of this search's semantic side (semantic and hybrid modes): larger finds
    more of the true nearest neighbours, slower. It is set for the search's own transaction
    only (``SET LOCAL``) and raised to ``limit`` when smaller.
    ``context_window=k`` (default ``SEARCH["CONTEXT_WINDOW"]``, 0: off) returns each hit with
    the text of the ``k`` chunks before and after it in its document as ``context`` (what
    :func:`ask` and the agent then give the LLM); hits whose windows overlap are merged into
    the best-ranked one (``merged_chunk_ids``), so fewer than ``limit`` results may come back.

    ``keyword_score_floor`` (default ``SEARCH["KEYWORD_SCORE_FLOOR"]``, 0.05): in hybrid mode
    with ``fusion="weighted"``, the full-text side is BM25 divided by the larger of the best
    candidate's BM25 and this floor, so a query whose words match only weakly keeps a weak
    full-text side instead of one stretched to 1 (0: divide by the best, whatever it is).

    ``diversity`` (0 to 1; default ``SEARCH["DIVERSITY"]``, 0: off) picks the ``limit`` results
    from the best ``candidates x limit`` by maximal marginal relevance: each next result is the
    candidate most relevant and least like the results above it (cosine similarity of the
    stored embeddings), so near-duplicate chunks give way to ones that add something
    (:mod:`django_rag.retrieval.diversity`). With a reranker, the reranker orders the
    candidates first.

    ``database`` is the ``DATABASES`` alias searched (default ``SEARCH["DATABASE"]``, else the
    routers' ``db_for_read(Chunk)``, else ``"default"``; docs/scaling.md): pass ``"default"``
    to read a write that has not reached the replica yet.
    """
    return search_with_match(query, options)[0]


def search_with_match(
    query: str, options: SearchOptions, owner: str = "search()"
) -> tuple[list[SearchResult], GraphMatch | None]:
    """:func:`search` with ``options`` as a dict (checked: an unknown one raises
    :class:`~django_rag.exceptions.InvalidOption` naming ``owner``), also returning what the
    graph path matched (None without it)."""
    request_options, components = split_options(options, owner)
    return search_request(build_request(query, **request_options), **components)


def search_request(
    request: SearchRequest, **components: Unpack[SearchComponents]
) -> tuple[list[SearchResult], GraphMatch | None]:
    """Answer a built :class:`SearchRequest` with these components (see :func:`search`);
    returns the results and what the graph path matched (None without it)."""
    reranker = components.get("reranker")
    rewriter = components.get("rewriter")
    graph = components.get("graph")
    graph_depth = components.get("graph_depth")
    entity_matcher = components.get("entity_matcher")
    graph_store = components.get("graph_store")
    embedder = components.get("embedder")
    vector_store = components.get("vector_store")
    if not request.query.strip():
        return [], None
    mode = request.mode
    uses_vector = implementation(mode).uses_vector
    limit = request.limit
    use_graph = graph_setting("ENABLED") if graph is None else graph
    query_text = request.query
    ranker = get_reranker(reranker)
    with span(
        "search",
        query=request.query,
        mode=mode.value,
        limit=limit,
        collections=None if request.collections is None else list(request.collections),
        reranker=ranker.name if ranker else None,
        rewriter=None if rewriter is None else getattr(rewriter, "__qualname__", str(rewriter)),
        database=request.database,
    ) as s:
        store = get_vector_store(vector_store)
        for option, read in (
            ("context_window", "the neighbouring chunks are"),
            ("diversity", "the chunks' embeddings are"),
        ):
            if getattr(request, option) and not isinstance(store, PgVectorStore):
                raise InvalidOption(
                    f"{option} needs the pgvector store ({read} read from PostgreSQL); "
                    "leave it 0 with another store."
                )
        if isinstance(store, PgVectorStore):
            # Resolved once, before any model loads (an unknown collection is reported
            # first); the store, the chunk scope and the graph read the ids. Other stores
            # keep their own collections and check the names themselves.
            request = resolve_scope(request)
        queries = _rewrite(request.query, rewriter, s) if rewriter is not None else [request.query]
        # The pool: larger than limit when a reranker or diversity picks from it.
        pool = limit
        if ranker is not None:
            pool = max(pool, limit * search_setting("RERANK_CANDIDATES"))
        if request.diversity > 0:
            pool = max(pool, limit * request.candidates)
        searched = replace(request, limit=min(pool, MAX_LIMIT))
        rankings = []
        for query in queries:
            vector = None
            if uses_vector:
                vector = embed_query(embedder, query, store, using=request.database)
            searched = replace(searched, query=query, vector=vector)
            with span(
                "vector_store.search",
                backend=type(store).__name__,
                mode=mode.value,
                limit=searched.limit,
            ) as store_span:
                rankings.append(store.search(searched))
                store_span.set(result_count=len(rankings[-1]))
        results = rankings[0] if len(rankings) == 1 else rrf_merge(rankings, rrf_k=request.rrf_k)
        match = None
        if use_graph:
            results, match = _with_graph(
                query_text,
                results,
                searched,
                store,
                graph_depth,
                entity_matcher,
                embedder,
                graph_store,
            )
            s.set(
                graph_enhanced=not match.skipped,
                entities_found=len(match.entities),
                graph_match_score=match.strength,
            )
            if match.skipped:
                s.set(graph_skipped=match.skipped)
        if ranker is not None:
            # With diversity, the reranker orders the whole pool for MMR to pick from.
            kept = searched.limit if request.diversity > 0 else limit
            results = _rerank(ranker, query_text, results, kept, s)
        if request.diversity > 0:
            results = diversify(
                results, limit, request.diversity, using=search_db(request.database)
            )
        results = results[:limit]
        if request.context_window:
            results = with_context(
                results, request.context_window, using=search_db(request.database)
            )
        s.set(
            result_count=len(results),
            queries=len(queries),
            reranked=ranker is not None,
            # Dropped unless TELEMETRY["INCLUDE_TEXT"] (signals.TEXT_KEYS).
            results=[{"chunk_id": r.chunk_id, "score": r.score, "text": r.text} for r in results],
        )
        return results, match


def _with_graph(query, results, request, store, depth, matcher, embedder, graph_store):

    if not isinstance(store, PgVectorStore):
        raise InvalidOption("graph=True needs the pgvector store (the graph lives in PostgreSQL)")
    weight = graph_number("WEIGHT")
    rrf_k = graph_number("RRF_K")
    vector = request.vector
    if vector is None and (matcher or graph_setting("ENTITY_MATCHER")) == "embedding":
        vector = embed_query(embedder, query, store, using=request.database)
    found, match = graph_results(
        query,
        vector,
        scoped_chunks(request),
        None if request.collection_ids is None else list(request.collection_ids),
        depth=graph_setting("DEPTH") if depth is None else depth,
        limit=request.limit,
        matcher=matcher,
        using=request.database,
        min_match_score=graph_number("MIN_MATCH_SCORE"),
        graph_store=graph_store,
    )
    return fuse_graph(results, found, match, weight=weight, rrf_k=rrf_k), match


def fuse_graph(
    results: list[SearchResult],
    found: list[SearchResult],
    match: GraphMatch,
    *,
    weight: float,
    rrf_k: float,
) -> list[SearchResult]:
    """``results`` with the graph list ``found`` fused in by weighted reciprocal rank fusion
    (``results`` weigh 1, ``found`` weighs ``weight``), ``graph_score`` set on every result.
    ``results`` come back unchanged (the same order and scores, ``graph_score`` None) when
    the graph list is empty or ``weight`` is 0; ``match.skipped`` then says why."""
    if found and weight == 0:
        match.skipped = "weight 0"
    if match.skipped or not found:
        return results
    scores = {r.chunk_id: r.graph_score for r in found}
    fused = rrf_merge([results, found], rrf_k=rrf_k, weights=[1.0, weight])
    for result in fused:
        result.graph_score = scores.get(result.chunk_id)
    return fused


def embed_query(
    embedder: Any, query: str, store: Any = None, *, using: str | None = None
) -> list[float]:
    """The query's embedding, checked before it reaches the database: the size of the store's
    vectors (:class:`DimensionMismatch`), finite and not all zero (:class:`EmbeddingFailed`).
    ``using``: the database searched (whose model switch decides the active embedder)."""

    try:
        vector = get_embedder(embedder, using=using).embed_query(query)
    except ValueError as exc:  # how Embedder reports NaN/infinite or malformed output
        if isinstance(exc, RagError):
            raise
        raise EmbeddingFailed(
            f"Embedding the query failed with {type(exc).__name__}: {exc}. Check the embedder, "
            "or search in fulltext mode."
        ) from exc
    dimensions = active_dimensions(using=using) if isinstance(store, PgVectorStore) else None
    check_query_vector(vector, dimensions=dimensions)
    return vector


#: The most queries a rewriter's answer adds to one search (each is a search of its own).
MAX_REWRITTEN_QUERIES = 10


def _rewrite(query: str, rewriter: Any, search_span: Any = None) -> list[str]:
    """The queries to search: the rewriter's, or ``query`` itself when it fails (degraded).

    A rewriter's answer is model output: a query longer than ``MAX_QUERY_CHARS`` or not valid
    text is left out (degraded), and at most :data:`MAX_REWRITTEN_QUERIES` are kept."""
    component = get_rewriter(rewriter)  # a bad rewriter spec is a configuration error: raised
    try:
        rewritten = component(query)
    except Exception as exc:
        _degrade(search_span, "rewriter", exc, "searching with the original query")
        return [query]

    def dropped(exc: InvalidInput) -> None:
        _degrade(search_span, "rewriter", exc, "leaving that query out")

    return _clean_rewritten(rewritten, dropped) or [query]


def _clean_rewritten(rewritten: Any, dropped: Any = None) -> list[str]:
    """A rewriter's answer (model output) as queries: each a valid string within
    ``MAX_QUERY_CHARS`` (others are left out, ``dropped(error)`` told), no repeats, at most
    :data:`MAX_REWRITTEN_QUERIES`."""
    queries = [rewritten] if isinstance(rewritten, str) else list(rewritten or [])
    kept: list[str] = []
    for item in queries[: MAX_REWRITTEN_QUERIES * 10]:
        if not isinstance(item, str) or not item.strip():
            continue
        try:
            cleaned = clean_query(item.strip())
        except InvalidInput as exc:
            if dropped is not None:
                dropped(exc)
            continue
        if cleaned and cleaned not in kept:
            kept.append(cleaned)
            if len(kept) == MAX_REWRITTEN_QUERIES:
                break
    return kept


@rejects_unknown_options("rewrite_query()")
def rewrite_query(query: str, *, rewriter: Any, llm: Any = None) -> str | list[str]:
    """``query`` rewritten by ``rewriter``, without searching: what ``search(rewriter=...)``
    would search for.

    ``rewriter`` is ``"rewrite"``, ``"expand"``, ``"keywords"``, ``"decompose"`` (these use
    ``llm``, else ``DJANGO_RAG["LLM"]``), a rewriter component, or a function
    ``query -> str | list[str]``. Returns a string when the rewriter gives one, else a list
    (``"decompose"``). The answer is model output: each query must be a valid string within
    ``MAX_QUERY_CHARS`` (others are left out), at most :data:`MAX_REWRITTEN_QUERIES` are kept,
    and :class:`~django_rag.exceptions.LLMResponseError` is raised when none is left. A
    missing or bad ``rewriter`` raises :class:`~django_rag.exceptions.InvalidOption`; the
    rewriter's own failure (an :class:`~django_rag.exceptions.LLMError`) is raised, not
    hidden as in a search.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("rewrite_query() needs a non-empty query string.")
    query = clean_query(query)
    if rewriter is None:
        raise InvalidOption(
            "rewrite_query() needs rewriter=: 'rewrite', 'expand', 'keywords', 'decompose', a "
            "rewriter component or a function query -> str | list[str]"
        )
    try:
        component = get_rewriter(rewriter, llm=llm)
    except ConfigurationError as exc:
        raise InvalidOption(f"rewrite_query() got a bad rewriter: {exc}") from exc
    if not isinstance(component, Component):
        call_arity(component, most=1, what="The rewriter")
    with span("rewrite_query", query=query) as s:
        rewritten = component(query)
        queries = _clean_rewritten(rewritten)
        s.set(queries=len(queries))
    if not queries:
        raise LLMResponseError(
            f"The rewriter returned no usable query (got {type(rewritten).__name__})."
        )
    return queries[0] if isinstance(rewritten, str) else queries


def _rerank(ranker: Any, query: str, results: list, limit: int, search_span: Any) -> list:
    """``ranker``'s order, or the retrieval order when the reranker fails (degraded)."""
    try:
        return ranker.rerank(query, results, top_k=limit)
    except Exception as exc:
        _degrade(search_span, "reranker", exc, "keeping the retrieval order")
        return results


def _degrade(search_span: Any, part: str, exc: Exception, what: str) -> None:
    """A failing rewriter or reranker degrades the search instead of failing it: the failure
    is logged and listed in the search span's ``degraded`` metadata. Configuration errors
    (a missing LLM or package) are still raised: they need fixing, not hiding."""
    import logging

    from django.core.exceptions import ImproperlyConfigured

    if isinstance(exc, ImproperlyConfigured):
        raise exc
    note = f"{part}: {type(exc).__name__}: {scrub_text(exc)[:200]} ({what})"
    logging.getLogger(__name__).warning("django_rag search degraded: %s", note)
    if search_span is not None:
        search_span.set(degraded=[*search_span.metadata.get("degraded", []), note])

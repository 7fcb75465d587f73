"""The retrieval steps: ``search`` (every query in every selected collection), ``reason``
(search again while an LLM judges the results insufficient) and ``rerank``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..exceptions import LLMError
from ..llm import get_llm, json_flag
from ..rerankers import LLMReranker, Reranker, get_reranker
from ..retrieval.stores import PgVectorStore, get_vector_store
from ..signals import span
from . import prompts
from .components import Searcher, build, component_name
from .context import Context, Retrieval, check_search_options
from .step_base import fallback, step, step_llm, usable_query


def _search_all(ctx: Context, searcher: Any, query: str, options: dict[str, Any]) -> None:
    """Search ``query`` in every collection of the scope; append what comes back."""
    scope = ctx.search_scope or [None]
    ids: dict[str, int] | None = None
    if type(searcher) is Searcher and isinstance(
        get_vector_store(options.get("vector_store")), PgVectorStore
    ):
        # The default searcher on pgvector: the scope's ids come from the run's one lookup.
        names = [name for name in scope if name is not None]
        ids = ctx.collection_ids(names, options.get("database"))
    for collection in scope:
        if ids is not None:
            chunks = searcher.search_resolved(
                query,
                collection,
                None if collection is None else ids[collection],
                limit=ctx.limit,
                threshold=ctx.threshold,
                **options,
            )
        else:
            chunks = searcher(
                query, collection, limit=ctx.limit, threshold=ctx.threshold, **options
            )
        ctx.results.append(Retrieval(query, collection, list(chunks)))
    if query not in ctx.queries_tried:
        ctx.queries_tried.append(query)


def _dedupe_results(ctx: Context) -> None:
    seen: set[Any] = set()
    kept = []
    for retrieval in ctx.results:
        chunks = []
        for chunk in retrieval.chunks:
            if chunk.chunk_id not in seen:
                seen.add(chunk.chunk_id)
                chunks.append(chunk)
        if chunks:
            kept.append(Retrieval(retrieval.question, retrieval.collection, chunks))
    ctx.results = kept


def _judge(ctx: Context, llm: Any, prompt: Any) -> dict[str, Any]:
    """Ask whether the chunks so far answer the question (first 10 chunks shown)."""
    return get_llm(step_llm(ctx, llm), feature="The sufficiency check").complete_json(
        (prompt or prompts.sufficiency_prompt)(ctx.question, ctx.chunks[:10]),
        context=ctx.chunks[:10],
    )


def _scope_names(scope: list[str | None]) -> str:
    return ", ".join(name or "every collection" for name in scope)


def _retrievals(results: list[Retrieval]) -> list[str]:
    return [
        f"“{r.question}” in {r.collection or 'every collection'}: {len(r.chunks)} chunk(s)"
        for r in results
    ]


@step(
    "search",
    phase="search",
    always=True,
    produces={
        "search_scope": ("Collections", _scope_names),
        "queries_tried": "Queries",
        "results": ("Found (each chunk once, under the first query)", _retrievals),
        "search_iterations": "Self-correction searches",
    },
)
def search(
    ctx: Context,
    *,
    searcher: Any = None,
    collection: str | None = None,
    collections: list[str] | None = None,
    self_correct: bool = False,
    max_iterations: int = 2,
    prompt: Any = None,
    rewrite_prompt: Any = None,
    llm: Any = None,
    **search_options: Any,
) -> None:
    """Search every (sub-)question in every collection of the scope.

    Scope: ``collections``/``collection`` given here, else those ``select`` chose, else the
    agent's ``collection`` scope, else every collection. Queries: ``sub_questions``, else the expanded, rewritten or original question.
    ``self_correct=True`` then asks the LLM whether the results answer the question and, while
    they do not (up to ``max_iterations`` times), searches a rewritten query and merges the
    results. ``search_options`` (mode, fusion, reranker...) go to the searcher along with the
    context's ``search_options``.
    """
    if ctx.skip_retrieval:
        ctx.results = []
        return
    component = build(searcher, Searcher)
    if isinstance(component, Searcher):
        # A custom searcher may take options of its own; the default takes search()'s.
        check_search_options(search_options, "the search step")
    if collections is not None:
        scope = list(collections)
    elif collection is not None:
        scope = [collection]
    elif ctx.collections:
        scope = list(ctx.collections)
    elif ctx.scope:
        scope = list(ctx.scope)
    else:
        scope = [None]
    ctx.search_scope = scope
    ctx.searcher = component
    options = {**ctx.search_options, **search_options}
    ctx.search_options = options
    questions = ctx.sub_questions or [ctx.query]
    with span(
        "agent.search",
        question=ctx.question,
        sub_questions=questions,
        collections=scope,
        searcher=component_name(component),
    ) as s:
        ctx.results = []
        for question in questions:
            _search_all(ctx, component, question, options)
        _dedupe_results(ctx)
        if self_correct:

            def requery(verdict: dict[str, Any]) -> str:
                model = get_llm(step_llm(ctx, llm), feature="Search self-correction")
                return model.complete(
                    (rewrite_prompt or prompts.requery_prompt)(
                        ctx.question, ctx.queries_tried, verdict.get("missing")
                    )
                ).text

            _search_until_sufficient(
                ctx,
                "search",
                component,
                options,
                counter="search_iterations",
                max_iterations=max_iterations,
                prompt=prompt,
                llm=llm,
                next_query=requery,
            )
        s.set(
            result_count=len(ctx.results),
            total_chunks=len(ctx.chunks),
            iterations=ctx.search_iterations,
        )


def _search_until_sufficient(
    ctx: Context,
    name: str,
    searcher: Any,
    options: dict[str, Any],
    *,
    counter: str,
    max_iterations: int,
    prompt: Any,
    llm: Any,
    next_query: Callable[[dict[str, Any]], str],
) -> None:
    """The loop of ``search(self_correct=True)`` and ``reason``: while the LLM judges the
    chunks insufficient, search the next query (never one already tried) and merge."""
    while getattr(ctx, counter) < max_iterations:
        try:
            verdict = _judge(ctx, llm, prompt)
            if json_flag(verdict, "sufficient"):
                return
            query = next_query(verdict).strip().strip('"')
        except LLMError as exc:
            fallback(ctx, name, exc, "keeping the results")
            return
        query = usable_query(ctx, name, query, "follow-up query", "keeping the results")
        if not query or query in ctx.queries_tried:
            return
        setattr(ctx, counter, getattr(ctx, counter) + 1)
        _search_all(ctx, searcher, query, options)
        _dedupe_results(ctx)


@step(
    "reason",
    phase="results",
    produces={"reason_iterations": "Follow-up searches", "queries_tried": "Queries searched"},
)
def reason(
    ctx: Context,
    *,
    max_iterations: int = 2,
    prompt: Any = None,
    llm: Any = None,
    searcher: Any = None,
) -> None:
    """Multi-hop: while the LLM finds the chunks insufficient, search its follow-up query.

    Follow-ups use the searcher and collection scope of the ``search`` step (never wider) and
    a query is never searched twice. An unparseable judgement counts as sufficient.
    """
    if ctx.skip_retrieval:
        return
    component = build(searcher, Searcher) if searcher is not None else ctx.searcher
    component = component or Searcher()
    if not ctx.queries_tried:
        ctx.queries_tried.append(ctx.query)
    with span("agent.reason", question=ctx.question) as s:
        _search_until_sufficient(
            ctx,
            "reason",
            component,
            ctx.search_options,
            counter="reason_iterations",
            max_iterations=max_iterations,
            prompt=prompt,
            llm=llm,
            next_query=lambda verdict: str(verdict.get("follow_up_query") or ""),
        )
        s.set(iterations=ctx.reason_iterations, total_chunks=len(ctx.chunks))


@step("rerank", phase="results", produces={"chunks": "Kept", "rerank_dropped": "Dropped"})
def rerank(
    ctx: Context,
    *,
    reranker: Any = None,
    threshold: float | None = None,
    top_k: int | None = None,
    prompt: Any = None,
    llm: Any = None,
) -> None:
    """Rerank every retrieved chunk against the question (``rerank_scores`` by chunk id).

    The default is the LLM reranker (0-10, ``threshold`` 7). Any reranker, alias or scoring
    function works; ``threshold`` and ``top_k`` are passed to it.
    """
    if ctx.skip_retrieval:
        return
    chunks = ctx.chunks
    if reranker is None:
        component: Reranker = LLMReranker(llm=step_llm(ctx, llm), prompt=prompt)
        if threshold is None:
            threshold = component.threshold
    else:
        component = get_reranker(reranker)
    with span("agent.rerank", question=ctx.question, reranker=component.name) as s:
        if not chunks:
            ctx.rerank_scores = {}
            s.set(original=0, kept=0)
            return
        # Score everything once, then cut here, so what is dropped keeps its score.
        scored = component.rerank(ctx.question, chunks, top_k=len(chunks), threshold=float("-inf"))
        threshold = component.threshold if threshold is None else threshold
        top_k = component.top_k if top_k is None else top_k
        kept = [
            chunk
            for chunk in scored
            if threshold is None or chunk.rerank_score is None or chunk.rerank_score >= threshold
        ]
        if top_k is not None:
            kept = kept[:top_k]
        kept_ids = {chunk.chunk_id for chunk in kept}
        ctx.rerank_dropped = [chunk for chunk in scored if chunk.chunk_id not in kept_ids]
        ctx.results = [Retrieval(ctx.question, "reranked", kept)] if kept else []
        ctx.rerank_scores = {
            chunk.chunk_id: chunk.rerank_score for chunk in kept if chunk.rerank_score is not None
        }
        s.set(original=len(chunks), kept=len(kept))

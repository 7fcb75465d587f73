"""The agent's steps as plain functions: each takes a :class:`Context`, updates it, returns it.

Every step:
- returns the context unchanged when an earlier step failed (``ctx.error`` is set);
- takes its own ``llm=`` (else ``ctx.llm``, else ``DJANGO_RAG["LLM"]``), a ``prompt=`` function
  where it prompts an LLM, and a custom component where it has one;
- falls back as documented when its LLM call fails or answers nonsense, noting it in
  ``ctx.warnings``; any other exception marks the step failed (``ctx.error``/``failed_step``);
- sends ``agent.<step>`` telemetry and adds its LLM usage to ``ctx.usage``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from ..answers.grounding import get_grounder, ground_text
from ..answers.service import make_answer, parse_citations
from ..conf import get_setting, scrub_text
from ..exceptions import InvalidInput, LLMError, LLMResponseError
from ..graph.global_search import global_answer as answer_globally
from ..llm import Completion, as_bool, collect_usage, deadline, get_llm, parse_json
from ..llm.errors import AgentTimeout
from ..models import Collection
from ..models.databases import search_db
from ..rerankers import LLMReranker, Reranker, get_reranker
from ..results import SearchResult
from ..retrieval.stores import PgVectorStore, get_vector_store
from ..signals import span
from ..validation import clean_query
from . import prompts
from .components import (
    Answerer,
    Decomposer,
    Expander,
    Gatekeeper,
    Rewriter,
    Searcher,
    Selector,
    build,
    component_name,
)
from .context import Context, Retrieval, check_search_options

logger = logging.getLogger(__name__)


def step(name: str) -> Callable:
    def decorator(func: Callable[..., None]) -> Callable[..., Context]:
        @functools.wraps(func)
        def run(ctx: Context, **options: Any) -> Context:
            if ctx.error is not None:
                return ctx
            if ctx.deadline_at is not None and time.monotonic() >= ctx.deadline_at:
                ctx.error = AgentTimeout(
                    f"The agent run passed its deadline ({ctx.deadline:g}s) before the {name} "
                    "step, which did not run (nor did the steps after it). Raise "
                    "DJANGO_RAG['AGENT_DEADLINE'] or Agent(deadline=...), or use fewer steps."
                )
                ctx.failed_step = name
                ctx.warnings.append(f"{name}: skipped, the agent's deadline had passed")
                logger.warning("django_rag agent step %s skipped: deadline passed", name)
                return ctx
            # LLM calls inside the step get at most what is left of the run's deadline.
            with collect_usage() as usage, deadline(at=ctx.deadline_at):
                try:
                    func(ctx, **options)
                except Exception as exc:
                    ctx.error = exc
                    ctx.failed_step = name
                    logger.warning(
                        "django_rag agent step %s failed: %s: %s",
                        name,
                        type(exc).__name__,
                        scrub_text(exc)[:500],
                    )
            ctx.usage.add(usage)
            return ctx

        run.step_name = name
        return run

    return decorator


def _fallback(ctx: Context, name: str, exc: Exception, what: str) -> None:
    message = scrub_text(exc)[:500]
    ctx.warnings.append(f"{name}: {message} ({what})")
    logger.info("django_rag agent step %s fell back: %s", name, message)


def _llm(ctx: Context, llm: Any) -> Any:
    return llm if llm is not None else ctx.llm


#: The most sub-questions ``decompose`` keeps (each is searched in every collection).
MAX_SUB_QUESTIONS = 10


def _usable(ctx: Context, name: str, query: Any, what: str, instead: str) -> str | None:
    """``query`` (an LLM's rewrite, expansion, sub-question or follow-up) when it can be
    searched, else None with a warning: empty, longer than ``MAX_QUERY_CHARS`` or not valid
    text, it is not used (``instead`` says what is)."""
    if not isinstance(query, str) or not query.strip():
        if query:  # an empty answer is the step's own fallback, not a warning
            ctx.warnings.append(f"{name}: the {what} was not text ({instead})")
        return None
    try:
        cleaned = clean_query(query.strip())
    except InvalidInput as exc:
        if len(query) > get_setting("MAX_QUERY_CHARS"):
            reason = (
                f"{len(query):,} characters, more than MAX_QUERY_CHARS "
                f"({get_setting('MAX_QUERY_CHARS'):,})"
            )
        else:
            reason = scrub_text(exc)[:200]
        ctx.warnings.append(f"{name}: the {what} was unusable: {reason} ({instead})")
        logger.info("django_rag agent step %s: unusable %s: %s", name, what, reason)
        return None
    return cleaned or None


@step("gate")
def gate(ctx: Context, *, gatekeeper: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Decide whether the question needs retrieval; sets ``skip_retrieval``/``gate_reasoning``.

    When the decision fails, retrieval goes ahead.
    """
    component = build(gatekeeper, Gatekeeper, llm=_llm(ctx, llm), prompt=prompt)
    with span("agent.gate", question=ctx.question, gatekeeper=component_name(component)) as s:
        try:
            decision = component(ctx.question)
        except LLMError as exc:
            _fallback(ctx, "gate", exc, "retrieving")
            decision = True
        if isinstance(decision, dict):
            needs, reasoning = decision.get("needs_retrieval", True), decision.get("reasoning")
        elif isinstance(decision, tuple):
            needs, reasoning = decision
        else:
            needs, reasoning = decision, None
        ctx.skip_retrieval = not bool(needs)
        ctx.gate_reasoning = reasoning
        s.set(skip_retrieval=ctx.skip_retrieval)


@step("rewrite")
def rewrite(ctx: Context, *, rewriter: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Turn a conversational question into a clean query (``rewritten_query``)."""
    if ctx.skip_retrieval:
        return
    component = build(rewriter, Rewriter, llm=_llm(ctx, llm), prompt=prompt)
    with span("agent.rewrite", question=ctx.question, rewriter=component_name(component)) as s:
        try:
            rewritten = component(ctx.question)
        except LLMError as exc:
            _fallback(ctx, "rewrite", exc, "searching with the question")
            rewritten = None
        ctx.rewritten_query = _usable(
            ctx, "rewrite", rewritten, "rewritten query", "searching with the question"
        )
        s.set(rewritten_query=ctx.rewritten_query)


@step("select")
def select(
    ctx: Context,
    *,
    collections: list[str] | None = None,
    selector: Any = None,
    prompt: Any = None,
    llm: Any = None,
    context: Any = None,
) -> None:
    """Choose the collections to search (``collections``/``selection_reasoning``).

    Offers ``collections`` (default: the agent's ``collection`` scope, else every
    collection) with their descriptions from the database. Names the selector returns that were not offered are dropped; when none is left,
    or the selector fails, every offered collection is used.
    """
    if ctx.skip_retrieval:
        return
    described = dict(Collection.objects.using(search_db()).values_list("name", "description"))
    if collections is not None:
        names = list(collections)
    elif ctx.scope is not None:
        names = list(ctx.scope)
    else:
        names = sorted(described)
    offered = [(name, described.get(name, "")) for name in names]
    component = build(selector, Selector, llm=_llm(ctx, llm), prompt=prompt)
    with span(
        "agent.select",
        question=ctx.question,
        available_collections=names,
        selector=component_name(component),
    ) as s:
        reasoning = None
        try:
            chosen = component(ctx.question, offered, context) if offered else []
        except LLMError as exc:
            _fallback(ctx, "select", exc, "using every collection")
            chosen = names
        if isinstance(chosen, tuple):
            chosen, reasoning = chosen
        valid = [name for name in dict.fromkeys(chosen or []) if name in names]
        if len(valid) < len(chosen or []):
            ctx.warnings.append(
                "select: ignored collections that were not offered: "
                + ", ".join(sorted(set(chosen) - set(names)))
            )
        ctx.collections = valid or names
        ctx.selection_reasoning = reasoning
        s.set(selected_count=len(ctx.collections), selected_collections=ctx.collections)


@step("expand")
def expand(ctx: Context, *, expander: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Add synonyms and related terms to the query (``expanded_query``)."""
    if ctx.skip_retrieval:
        return
    component = build(expander, Expander, llm=_llm(ctx, llm), prompt=prompt)
    query = ctx.query
    with span("agent.expand", question=query, expander=component_name(component)) as s:
        try:
            expanded = component(query)
        except LLMError as exc:
            _fallback(ctx, "expand", exc, "searching with the unexpanded query")
            expanded = None
        ctx.expanded_query = _usable(
            ctx, "expand", expanded, "expanded query", "searching with the unexpanded query"
        )
        s.set(expanded_query=ctx.expanded_query)


@step("decompose")
def decompose(ctx: Context, *, decomposer: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Split a compound question into sub-questions, each searched on its own.

    When decomposition fails, the query itself is the only sub-question.
    """
    if ctx.skip_retrieval:
        return
    component = build(decomposer, Decomposer, llm=_llm(ctx, llm), prompt=prompt)
    query = ctx.query
    with span("agent.decompose", question=query, decomposer=component_name(component)) as s:
        try:
            answered = component(query) or []
        except LLMError as exc:
            _fallback(ctx, "decompose", exc, "searching with the whole question")
            answered = []
        if isinstance(answered, str):  # one sub-question, not its characters
            answered = [answered]
        questions = []
        for item in answered:
            if len(questions) == MAX_SUB_QUESTIONS:
                ctx.warnings.append(
                    f"decompose: kept the first {MAX_SUB_QUESTIONS} sub-questions, left out "
                    "the rest"
                )
                break
            usable = _usable(ctx, "decompose", item, "sub-question", "left out")
            if usable and usable not in questions:
                questions.append(usable)
        ctx.sub_questions = questions or [query]
        s.set(sub_question_count=len(ctx.sub_questions), sub_questions=ctx.sub_questions)


# --- search and multi-hop reasoning -----------------------------------------------------------


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
    text = get_llm(_llm(ctx, llm), feature="The sufficiency check").complete(
        (prompt or prompts.sufficiency_prompt)(ctx.question, ctx.chunks[:10])
    )
    return parse_json(text.text)


@step("search")
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
                model = get_llm(_llm(ctx, llm), feature="Search self-correction")
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
            if as_bool(verdict.get("sufficient", True)):
                return
            query = next_query(verdict).strip().strip('"')
        except LLMError as exc:
            _fallback(ctx, name, exc, "keeping the results")
            return
        query = _usable(ctx, name, query, "follow-up query", "keeping the results")
        if not query or query in ctx.queries_tried:
            return
        setattr(ctx, counter, getattr(ctx, counter) + 1)
        _search_all(ctx, searcher, query, options)
        _dedupe_results(ctx)


@step("reason")
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


@step("rerank")
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
        component: Reranker = LLMReranker(llm=_llm(ctx, llm), prompt=prompt)
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


@step("answer")
def answer(
    ctx: Context,
    *,
    answerer: Any = None,
    prompt: Any = None,
    llm: Any = None,
    self_correct: bool = False,
    max_corrections: int = 2,
    judge_prompt: Any = None,
) -> None:
    """Write the answer from the retrieved chunks (none when retrieval was skipped).

    ``self_correct=True`` has the LLM check the answer against the chunks and rewrite it from
    the feedback, up to ``max_corrections`` times (``corrections`` keeps the history).
    """
    chunks = [] if ctx.skip_retrieval else ctx.chunks
    component = build(answerer, Answerer, llm=_llm(ctx, llm), prompt=prompt)
    with span("agent.answer", question=ctx.question, answerer=component_name(component)) as s:
        if isinstance(component, Answerer):
            result = component(ctx.question, chunks, skip_retrieval=ctx.skip_retrieval)
        else:
            result = component(ctx.question, chunks)
        completion = result if isinstance(result, Completion) else Completion(str(result or ""))
        final = make_answer(ctx.question, completion, chunks)
        ctx.answer = final.text
        ctx.context_used = chunks
        ctx.correction_count = 0
        ctx.corrections = []
        if self_correct and chunks:
            _self_correct(ctx, chunks, max_corrections, judge_prompt, _llm(ctx, llm))
        ctx.citations = parse_citations(ctx.answer, chunks)
        s.set(
            context_chunk_count=len(chunks),
            correction_count=ctx.correction_count,
            success=ctx.error is None,
        )


def _self_correct(ctx, chunks: list[SearchResult], max_corrections, judge_prompt, llm) -> None:
    model = get_llm(llm, feature="Answer self-correction")
    for attempt in range(1, max_corrections + 1):
        with span("agent.self_correct", attempt=attempt) as s:
            try:
                verdict = parse_json(
                    model.complete(
                        (judge_prompt or prompts.groundedness_prompt)(
                            ctx.question, chunks, ctx.answer
                        )
                    ).text
                )
            except LLMError as exc:
                _fallback(ctx, "answer", exc, "keeping the answer")
                s.set(result="eval_failed")
                return
            if as_bool(verdict.get("grounded", True)):
                s.set(result="accepted")
                return
            feedback = str(verdict.get("feedback") or "").strip() or (
                "Make sure every statement is supported by the sources and cited."
            )
            system, user = prompts.correction_messages(ctx.question, chunks, ctx.answer, feedback)
            try:
                corrected = model.complete(user, system=system).text.strip()
                if not corrected:
                    raise LLMResponseError("The LLM returned an empty corrected answer.")
            except LLMError as exc:
                ctx.error = exc
                ctx.failed_step = "answer"
                s.set(result="error")
                return
            ctx.corrections.append({"answer": ctx.answer, "feedback": feedback})
            ctx.answer = corrected
            ctx.correction_count += 1
            s.set(result="corrected")


@step("ground")
def ground(ctx: Context, *, grounder: Any = True, llm: Any = None) -> None:
    """Check the answer against the chunks it was written from; sets ``grounding``.

    ``grounder`` is ``True`` (the ``GROUNDER`` setting), an alias (``"llm"``,
    ``"cross-encoder"``...), a spec, a function or a :class:`~.grounding.Grounder`. A failing
    grounder leaves a warning (and a grounding with score 0), never a failed run.
    """
    if ctx.answer is None:
        ctx.warnings.append("ground: no answer to ground (run the answer step first)")
        return
    component = get_grounder(grounder, llm=_llm(ctx, llm))
    ctx.grounding = ground_text(ctx.answer, ctx.context_used, component, question=ctx.question)
    ctx.warnings.extend(f"ground: {w}" for w in ctx.grounding.warnings if "failed" in w)


@step("global_answer")
def global_answer(
    ctx: Context, *, collection: Any = None, levels: Any = None, llm: Any = None
) -> None:
    """Answer a corpus-wide question from community summaries (GraphRAG's global mode)."""

    with span("agent.global_answer", question=ctx.question) as s:
        result = answer_globally(
            ctx.question,
            llm=_llm(ctx, llm),
            collection=collection or ctx.collections or ctx.scope,
            levels=levels,
        )
        ctx.answer = result.text
        ctx.context_used = []
        ctx.citations = []
        s.set(success=True)


STEPS = {
    func.step_name: func
    for func in (
        gate,
        rewrite,
        select,
        expand,
        decompose,
        search,
        reason,
        rerank,
        answer,
        ground,
        global_answer,
    )
}

"""The steps before search, on the question: ``gate`` (is retrieval needed), ``rewrite``,
``select`` (which collections), ``expand`` and ``decompose`` (sub-questions).
"""

from __future__ import annotations

from typing import Any

from ..exceptions import LLMError
from ..models import Collection
from ..models.databases import search_db
from ..signals import span
from .components import Decomposer, Expander, Gatekeeper, Rewriter, Selector, build, component_name
from .context import Context
from .step_base import fallback, step, step_llm, usable_query

#: The most sub-questions ``decompose`` keeps (each is searched in every collection).
MAX_SUB_QUESTIONS = 10


def _decision(skip: bool) -> str:
    return "answer without retrieval" if skip else "retrieve"


@step(
    "gate",
    phase="query",
    produces={"skip_retrieval": ("Decision", _decision), "gate_reasoning": "Reasoning"},
)
def gate(ctx: Context, *, gatekeeper: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Decide whether the question needs retrieval; sets ``skip_retrieval``/``gate_reasoning``.

    When the decision fails, retrieval goes ahead.
    """
    component = build(gatekeeper, Gatekeeper, llm=step_llm(ctx, llm), prompt=prompt)
    with span("agent.gate", question=ctx.question, gatekeeper=component_name(component)) as s:
        try:
            decision = component(ctx.question)
        except LLMError as exc:
            fallback(ctx, "gate", exc, "retrieving")
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


@step("rewrite", phase="query", produces={"rewritten_query": "Query"})
def rewrite(ctx: Context, *, rewriter: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Turn a conversational question into a clean query (``rewritten_query``)."""
    if ctx.skip_retrieval:
        return
    component = build(rewriter, Rewriter, llm=step_llm(ctx, llm), prompt=prompt)
    with span("agent.rewrite", question=ctx.question, rewriter=component_name(component)) as s:
        try:
            rewritten = component(ctx.question)
        except LLMError as exc:
            fallback(ctx, "rewrite", exc, "searching with the question")
            rewritten = None
        ctx.rewritten_query = usable_query(
            ctx, "rewrite", rewritten, "rewritten query", "searching with the question"
        )
        s.set(rewritten_query=ctx.rewritten_query)


@step(
    "select",
    phase="query",
    label="Select collections",
    produces={
        "collections": "Chose",
        "offered_collections": "Offered",
        "selection_reasoning": "Reasoning",
    },
)
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
    ctx.offered_collections = names
    component = build(selector, Selector, llm=step_llm(ctx, llm), prompt=prompt)
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
            fallback(ctx, "select", exc, "using every collection")
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


@step("expand", phase="query", produces={"expanded_query": "Query"})
def expand(ctx: Context, *, expander: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Add synonyms and related terms to the query (``expanded_query``)."""
    if ctx.skip_retrieval:
        return
    component = build(expander, Expander, llm=step_llm(ctx, llm), prompt=prompt)
    query = ctx.query
    with span("agent.expand", question=query, expander=component_name(component)) as s:
        try:
            expanded = component(query)
        except LLMError as exc:
            fallback(ctx, "expand", exc, "searching with the unexpanded query")
            expanded = None
        ctx.expanded_query = usable_query(
            ctx, "expand", expanded, "expanded query", "searching with the unexpanded query"
        )
        s.set(expanded_query=ctx.expanded_query)


@step("decompose", phase="query", produces={"sub_questions": "Sub-questions"})
def decompose(ctx: Context, *, decomposer: Any = None, prompt: Any = None, llm: Any = None) -> None:
    """Split a compound question into sub-questions, each searched on its own.

    When decomposition fails, the query itself is the only sub-question.
    """
    if ctx.skip_retrieval:
        return
    component = build(decomposer, Decomposer, llm=step_llm(ctx, llm), prompt=prompt)
    query = ctx.query
    with span("agent.decompose", question=query, decomposer=component_name(component)) as s:
        try:
            answered = component(query) or []
        except LLMError as exc:
            fallback(ctx, "decompose", exc, "searching with the whole question")
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
            usable = usable_query(ctx, "decompose", item, "sub-question", "left out")
            if usable and usable not in questions:
                questions.append(usable)
        ctx.sub_questions = questions or [query]
        s.set(sub_question_count=len(ctx.sub_questions), sub_questions=ctx.sub_questions)

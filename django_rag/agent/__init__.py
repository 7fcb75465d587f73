"""The agentic pipeline: composable steps over a shared :class:`Context`.

Fluent::

    ctx = (rag.Agent("Compare plan A and plan B", llm="openai/gpt-4o-mini")
           .gate().rewrite().decompose().search(collection="plans").reason()
           .rerank(threshold=7).answer(self_correct=True).ground())
    print(ctx.answer, ctx.citations, ctx.usage)

Functional::

    from django_rag.agent import Context, steps
    ctx = steps.answer(steps.search(steps.gate(Context("...", llm=my_llm))))

Tool calling (the model decides what to search and when to stop)::

    result = rag.Loop("Compare plan A and plan B", collection="plans", llm=...).run()
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Unpack

from django.core.exceptions import ImproperlyConfigured

from ..answers.grounding import (
    CrossEncoderGrounder,
    EmbeddingGrounder,
    Grounder,
    LLMGrounder,
    get_grounder,
    ground_answer,
)
from ..answers.service import Answer, AnswerStream, Citation, ask, parse_citations
from ..retrieval.aliases import accepts_aliases
from ..retrieval.options import AgentSearchOptions
from . import steps
from .components import (
    Answerer,
    Component,
    Decomposer,
    Expander,
    Gatekeeper,
    KeywordExtractor,
    Rewriter,
    Searcher,
    Selector,
    get_rewriter,
)
from .context import Context, Retrieval
from .loop import Loop, LoopResult, Tool, ToolError, ToolStep, run_loop


class Agent:
    """Fluent wrapper around a :class:`Context`: each step method runs the step of the same
    name in :mod:`django_rag.agent.steps` and returns the agent, so steps chain. The methods
    are made from the step registry (``steps.STEPS``), with each step's options and docstring:
    a step registered later gets its method too.

    Fields of the context are read through ``agent.context`` (``agent.context.answer`` is the
    answer text); those that are not step names can also be read on the agent itself
    (``agent.error``, ``agent.usage``, ``agent.chunks``). ``agent.result`` is an
    :class:`Answer`.

    ``collection`` (a name or a list of names) is the run's scope: the collections searched
    when a step names none, and those ``select`` chooses from, as ``search(collection=...)``
    takes them (an unknown name raises :class:`~django_rag.exceptions.UnknownCollection`).
    ``search_options`` must be options :func:`~django_rag.search` takes (``mode``,
    ``fusion``, ``reranker``, ``metadata``, ``source_id``...): any other raises
    :class:`~django_rag.exceptions.InvalidOption` here, naming it.

    The whole run must end within ``deadline`` seconds (default
    ``DJANGO_RAG["AGENT_DEADLINE"]``, from the agent's creation): LLM calls get what is left,
    and steps that would start later are skipped with ``error`` set to an
    :class:`~django_rag.llm.AgentTimeout`.
    """

    @accepts_aliases("Agent")
    def __init__(
        self,
        question: str,
        *,
        llm: Any = None,
        collection: str | Sequence[str] | None = None,
        limit: int = 5,
        threshold: float | None = None,
        deadline: float | None = None,
        **search_options: Unpack[AgentSearchOptions],
    ):
        self.context = Context(
            question=question,
            llm=llm,
            limit=limit,
            threshold=threshold,
            search_options=search_options,
            deadline=deadline,
            scope=collection,
        )

    @property
    def result(self) -> Answer | None:
        """The answer as an :class:`Answer` (text, chunks, citations, usage) once it ran."""
        return self.context.to_answer()

    def __getattr__(self, name: str) -> Any:
        # Only called for names the agent lacks: the context's fields and properties.
        if name == "context":
            raise AttributeError(name)
        return getattr(self.context, name)

    def __repr__(self) -> str:
        return f"<Agent question={self.context.question[:40]!r} error={self.context.error!r}>"


def _chain_method(spec: steps.StepSpec) -> Any:
    """``Agent.<step>(**options)``: run the step on the agent's context, return the agent."""

    def method(self: Agent, **options: Any) -> Agent:
        spec(self.context, **options)
        return self

    parameters = list(inspect.signature(spec.run).parameters.values())[1:]
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = inspect.Signature(
        [self_parameter, *parameters], return_annotation="Agent"
    )
    method.__name__ = spec.name
    method.__qualname__ = f"Agent.{spec.name}"
    method.__doc__ = spec.doc
    method.__module__ = __name__
    method.agent_step = spec.name
    return method


def _sync_chain_methods(registry: steps.StepRegistry) -> None:
    """One chain method per registered step, none for a step no longer registered."""
    for name, value in list(vars(Agent).items()):
        if getattr(value, "agent_step", None) is not None and name not in registry:
            delattr(Agent, name)
    for name, spec in registry.items():
        current = vars(Agent).get(name)
        if current is not None and getattr(current, "agent_step", None) is None:
            raise ImproperlyConfigured(
                f"the agent step {name!r} would hide Agent.{name}; choose another name"
            )
        if current is None or getattr(current, "spec", None) is not spec:
            method = _chain_method(spec)
            method.spec = spec
            setattr(Agent, name, method)


steps.STEPS.listen(_sync_chain_methods)


__all__ = [
    "Agent",
    "Answer",
    "AnswerStream",
    "Answerer",
    "Citation",
    "Component",
    "Context",
    "CrossEncoderGrounder",
    "EmbeddingGrounder",
    "Grounder",
    "LLMGrounder",
    "Decomposer",
    "Expander",
    "Gatekeeper",
    "KeywordExtractor",
    "Loop",
    "LoopResult",
    "Retrieval",
    "Rewriter",
    "Searcher",
    "Selector",
    "Tool",
    "ToolError",
    "ToolStep",
    "ask",
    "get_grounder",
    "get_rewriter",
    "ground_answer",
    "parse_citations",
    "run_loop",
    "steps",
]

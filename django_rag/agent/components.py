"""The pluggable parts of the agent's steps, with their LLM-backed defaults.

Each step takes a component: an instance of the base class below, a subclass (built with the
step's ``llm`` and ``prompt``), or a plain function with the same call signature:

============  ==============================================  ====================================
step          call                                            returns
============  ==============================================  ====================================
gate          ``gatekeeper(question)``                        bool, (bool, reasoning) or a dict
rewrite       ``rewriter(question)``                          the rewritten query
select        ``selector(question, collections, context)``    names, or (names, reasoning)
expand        ``expander(query)``                             the expanded query
decompose     ``decomposer(query)``                           a list of sub-questions
search        ``searcher(query, collection, **options)``      a list of SearchResult
answer        ``answerer(question, chunks)``                  the answer text (or a Completion)
============  ==============================================  ====================================

``collections`` is a list of ``(name, description)`` pairs; ``context`` is whatever the caller
passed as ``select(context=...)`` (a user, a tenant...). The rewriters double as
``search(..., rewriter=...)`` helpers: ``"rewrite"``, ``"expand"``, ``"keywords"``,
``"decompose"``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ..exceptions import ConfigurationError, LLMResponseError
from ..llm import Completion, as_bool, get_llm, parse_json
from ..retrieval.results import SearchResult
from . import prompts
from .answer import answer_messages


class Component:
    """Base of the LLM-backed components: holds the ``llm`` and ``prompt`` they use."""

    default_prompt: Callable[..., str] | None = None

    def __init__(self, *, llm: Any = None, prompt: Callable[..., Any] | None = None):
        self.llm = llm
        self.prompt = prompt or type(self).default_prompt

    def complete(self, prompt: str, *, system: str | None = None) -> str:
        llm = get_llm(self.llm, feature=f"The {type(self).__name__}")
        return llm.complete(prompt, system=system).text.strip()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _one_line(text: str, what: str) -> str:
    line = text.strip().strip("`").strip().splitlines()[0].strip().strip('"') if text else ""
    if not line:
        raise LLMResponseError(f"The LLM returned an empty {what}.")
    return line


class Gatekeeper(Component):
    """Decides whether a question needs retrieval at all."""

    default_prompt = staticmethod(prompts.gate_prompt)

    def __call__(self, question: str) -> tuple[bool, str | None]:
        data = parse_json(self.complete(self.prompt(question)))
        reasoning = data.get("reasoning")
        return as_bool(data.get("needs_retrieval", True)), reasoning if reasoning else None


class Rewriter(Component):
    """Cleans a conversational message into a search query."""

    default_prompt = staticmethod(prompts.rewrite_prompt)

    def __call__(self, question: str) -> str:
        return _one_line(self.complete(self.prompt(question)), "rewritten query")


class Expander(Component):
    """Adds synonyms and related terms to a query."""

    default_prompt = staticmethod(prompts.expand_prompt)

    def __call__(self, query: str) -> str:
        return _one_line(self.complete(self.prompt(query)), "expanded query")


class KeywordExtractor(Component):
    """Reduces a question to its search keywords."""

    default_prompt = staticmethod(prompts.keywords_prompt)

    def __call__(self, query: str) -> str:
        return _one_line(self.complete(self.prompt(query)), "keyword list")


class Decomposer(Component):
    """Splits a compound question into searchable sub-questions."""

    default_prompt = staticmethod(prompts.decompose_prompt)

    def __init__(self, *, max_sub_questions: int = 4, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_sub_questions = max_sub_questions

    def __call__(self, query: str) -> list[str]:
        data = parse_json(self.complete(self.prompt(query)))
        for key in ("sub_questions", "subquestions", "questions"):
            items = data.get(key)
            if isinstance(items, list):
                questions = [str(item).strip() for item in items if str(item).strip()]
                if questions:
                    return list(dict.fromkeys(questions))[: self.max_sub_questions]
        raise LLMResponseError("The decomposer's JSON had no list of sub-questions.")


class Selector(Component):
    """Picks the collections to search from their names and descriptions."""

    default_prompt = staticmethod(prompts.select_prompt)

    def __call__(
        self, question: str, collections: Sequence[tuple[str, str]], context: Any = None
    ) -> tuple[list[str], str | None]:
        data = parse_json(self.complete(self.prompt(question, collections)))
        names = data.get("collections")
        if not isinstance(names, list):
            raise LLMResponseError("The selector's JSON had no 'collections' list.")
        return [str(name) for name in names], data.get("reasoning") or None


class Searcher:
    """The default searcher: :func:`django_rag.search` with the agent's search options."""

    def __call__(self, query: str, collection: str | None, **options: Any) -> list[SearchResult]:
        from ..retrieval.service import search

        return search(query, collection=collection, **options)

    def __repr__(self) -> str:
        return "<Searcher>"


class Answerer(Component):
    """Writes the answer from the chunks (numbered sources, cited as [n])."""

    def __call__(
        self, question: str, chunks: Sequence[SearchResult], *, skip_retrieval: bool = False
    ) -> Completion:
        system, user = answer_messages(
            question, chunks, prompt=self.prompt, skip_retrieval=skip_retrieval
        )
        llm = get_llm(self.llm, feature="The answer step")
        return llm.complete(user, system=system)


def build(spec: Any, default: type, *, llm: Any = None, prompt: Any = None, **kwargs: Any):
    """Resolve a step's component option: None -> the default, a class -> an instance."""
    if spec is None:
        spec = default
    if inspect.isclass(spec):
        if issubclass(spec, Component):
            return spec(llm=llm, prompt=prompt, **kwargs)
        return spec()
    if callable(spec):
        return spec
    raise ConfigurationError(
        default.__name__.lower(), spec, "expected a component class, instance or function"
    )


def component_name(component: Any) -> str:
    """How telemetry names a component: its class, or ``custom_function`` for a function."""
    if inspect.isfunction(component) or inspect.ismethod(component):
        return "custom_function"
    return type(component).__name__


REWRITERS = {
    "rewrite": Rewriter,
    "expand": Expander,
    "keywords": KeywordExtractor,
    "decompose": Decomposer,
}


def get_rewriter(spec: Any) -> Callable[[str], str | list[str]]:
    """A query rewriter for ``search(rewriter=...)``: an alias, a component or a function."""
    if isinstance(spec, str):
        if spec not in REWRITERS:
            raise ConfigurationError(
                "rewriter", spec, f"known rewriters are {', '.join(sorted(REWRITERS))}"
            )
        return REWRITERS[spec]()
    if inspect.isclass(spec) and issubclass(spec, Component):
        return spec()
    if callable(spec):
        return spec
    raise ConfigurationError(
        "rewriter", spec, "expected 'rewrite', 'expand', 'keywords', 'decompose' or a function"
    )

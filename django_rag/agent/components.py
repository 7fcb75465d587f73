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
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..answers.service import answer_messages
from ..exceptions import ConfigurationError, LLMResponseError
from ..llm import Completion, get_llm, json_flag
from ..llm.component import Component
from ..results import SearchResult
from ..retrieval.request import build_request, request_option_names
from ..retrieval.rewriters import (  # noqa: F401 (re-exported: the agent's steps use them)
    REWRITERS,
    Decomposer,
    Expander,
    KeywordExtractor,
    Rewriter,
    get_rewriter,
)
from ..retrieval.service import search, search_request
from . import prompts


class Gatekeeper(Component):
    """Decides whether a question needs retrieval at all."""

    default_prompt = staticmethod(prompts.gate_prompt)

    def __call__(self, question: str) -> tuple[bool, str | None]:
        data = self.complete_json(self.prompt(question))
        reasoning = data.get("reasoning")
        return json_flag(data, "needs_retrieval"), reasoning if reasoning else None


class Selector(Component):
    """Picks the collections to search from their names and descriptions."""

    default_prompt = staticmethod(prompts.select_prompt)

    def __call__(
        self, question: str, collections: Sequence[tuple[str, str]], context: Any = None
    ) -> tuple[list[str], str | None]:
        data = self.complete_json(self.prompt(question, collections))
        names = data.get("collections")
        if not isinstance(names, list):
            raise LLMResponseError("The selector's JSON had no 'collections' list.")
        return [str(name) for name in names], data.get("reasoning") or None


class Searcher:
    """The default searcher: :func:`django_rag.search` with the agent's search options."""

    def __call__(self, query: str, collection: str | None, **options: Any) -> list[SearchResult]:
        return search(query, collection=collection, **options)

    def search_resolved(
        self, query: str, collection: str | None, collection_id: int | None, **options: Any
    ) -> list[SearchResult]:
        """:meth:`__call__` with the collection's id already read (no collection lookup):
        the agent resolves its scope once per run and searches with the ids."""
        request = build_request(
            query,
            collection=collection,
            **{k: v for k, v in options.items() if k in request_option_names()},
        )
        if collection is not None and collection_id is not None:
            request = replace(request, collection_ids=(collection_id,))
        components = {k: v for k, v in options.items() if k not in request_option_names()}
        return search_request(request, **components)[0]

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
        return llm.complete(user, system=system, context=chunks)


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

"""Query rewriters: ``search(..., rewriter=...)`` and the agent's rewrite/expand/decompose steps.

``"rewrite"`` cleans a conversational message into a query, ``"expand"`` adds synonyms,
``"keywords"`` keeps the search terms, ``"decompose"`` splits a compound question into
sub-questions (each searched, results merged by RRF). Any function ``query -> str | list[str]``
works too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigurationError, LLMResponseError
from ..llm.component import Component, one_line
from ..llm.prompting import quote

# --- default prompts --------------------------------------------------------------------------


def rewrite_prompt(question: str) -> str:
    return (
        "Turn the message below into a clean search query. Remove greetings, pleasantries, "
        "filler and sign-offs. Keep every name, technical term, number and qualifier, and add "
        "nothing new. If it is already a clean query, return it unchanged.\n\n"
        f"<message>\n{quote(question)}\n</message>\n\n"
        "Reply with the query only, on one line."
    )


def expand_prompt(query: str) -> str:
    return (
        "Broaden this search query so that it also matches documents that use other words for "
        "the same things. Keep every original term, then add synonyms, closely related terms "
        "and spelled-out forms of abbreviations you are sure about. Leave terms you do not "
        "recognise as they are.\n"
        'Example: "k8s pod OOM" -> "k8s kubernetes pod container OOM out of memory killed '
        'memory limit"\n\n'
        f"Query: {query}\n\nReply with the expanded query only, on one line."
    )


def keywords_prompt(query: str) -> str:
    return (
        "List the search keywords of this question: the names, technical terms and content "
        "words a matching document would contain. Leave out question words and filler.\n\n"
        f"Question: {query}\n\nReply with the keywords only, separated by spaces, on one line."
    )


def decompose_prompt(query: str) -> str:
    return (
        "If the question below asks several things, or needs facts about several subjects, "
        "split it into 2 to 4 self-contained sub-questions that can each be searched for on "
        "their own. If it asks one simple thing, return it unchanged as the only item. Keep "
        "unfamiliar terms and abbreviations exactly as written.\n\n"
        f"Question: {query}\n\n"
        'Reply with JSON only: {"sub_questions": ["...", "..."]}'
    )


# --- components -------------------------------------------------------------------------------


class Rewriter(Component):
    """Cleans a conversational message into a search query."""

    default_prompt = staticmethod(rewrite_prompt)

    def __call__(self, question: str) -> str:
        return one_line(self.complete(self.prompt(question)), "rewritten query")


class Expander(Component):
    """Adds synonyms and related terms to a query."""

    default_prompt = staticmethod(expand_prompt)

    def __call__(self, query: str) -> str:
        return one_line(self.complete(self.prompt(query)), "expanded query")


class KeywordExtractor(Component):
    """Reduces a question to its search keywords."""

    default_prompt = staticmethod(keywords_prompt)

    def __call__(self, query: str) -> str:
        return one_line(self.complete(self.prompt(query)), "keyword list")


class Decomposer(Component):
    """Splits a compound question into searchable sub-questions."""

    default_prompt = staticmethod(decompose_prompt)

    def __init__(self, *, max_sub_questions: int = 4, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_sub_questions = max_sub_questions

    def __call__(self, query: str) -> list[str]:
        data = self.complete_json(self.prompt(query))
        for key in ("sub_questions", "subquestions", "questions"):
            items = data.get(key)
            if isinstance(items, list):
                questions = [str(item).strip() for item in items if str(item).strip()]
                if questions:
                    return list(dict.fromkeys(questions))[: self.max_sub_questions]
        raise LLMResponseError("The decomposer's JSON had no list of sub-questions.")


REWRITERS = {
    "rewrite": Rewriter,
    "expand": Expander,
    "keywords": KeywordExtractor,
    "decompose": Decomposer,
}


def get_rewriter(spec: Any, *, llm: Any = None) -> Callable[[str], str | list[str]]:
    """A query rewriter for ``search(rewriter=...)``: an alias, a component or a function
    (an alias or a component class is built with ``llm``, None: the ``LLM`` setting)."""
    if isinstance(spec, str):
        if spec not in REWRITERS:
            raise ConfigurationError(
                "rewriter", spec, f"known rewriters are {', '.join(sorted(REWRITERS))}"
            )
        return REWRITERS[spec](llm=llm)
    if inspect.isclass(spec) and issubclass(spec, Component):
        return spec(llm=llm)
    if callable(spec):
        return spec
    raise ConfigurationError(
        "rewriter", spec, "expected 'rewrite', 'expand', 'keywords', 'decompose' or a function"
    )

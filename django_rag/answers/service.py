"""Answers with citations: ``ask()`` and the answer generation the agent shares with it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack

from ..conf import call_defaults, import_string, section_setting
from ..exceptions import ConfigurationError, InvalidInput, InvalidOption, LLMResponseError
from ..graph.global_search import global_answer
from ..graph.search import graph_context
from ..llm import LLM, Completion, collect_usage, get_llm
from ..results import Answer, Citation, SearchResult
from ..retrieval.aliases import accepts_aliases
from ..retrieval.options import SearchComponents, SearchOptions, split_options
from ..retrieval.request import SearchRequest, build_request
from ..retrieval.service import search_request
from ..signals import span
from ..utils import call_arity
from ..validation import clean_query
from . import prompts
from .grounding import Grounder, get_grounder, ground_answer

#: ``prompt(question, chunks)`` or ``prompt(question, chunks, graph_context)``.
PromptFunction = Callable[..., "str | tuple[str, str]"]

_CITATION = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")


def parse_citations(text: str, chunks: Sequence[SearchResult]) -> list[Citation]:
    """The sources ``text`` cites as ``[n]`` / ``[n, m]``, in order of first mention.

    Numbers outside 1..len(chunks) are ignored (a model may invent them).
    """
    seen: dict[int, Citation] = {}
    for match in _CITATION.finditer(text):
        for part in re.split(r"[,;]", match.group(1)):
            number = int(part)
            if 1 <= number <= len(chunks) and number not in seen:
                seen[number] = Citation(number, chunks[number - 1])
    return list(seen.values())


def answer_messages(
    question: str,
    chunks: Sequence[SearchResult],
    *,
    prompt: PromptFunction | None = None,
    skip_retrieval: bool = False,
    graph: dict | None = None,
) -> tuple[str | None, str]:
    """(system, user) for an answer. A custom ``prompt(question, chunks)`` or
    ``prompt(question, chunks, graph_context)`` (chosen by :func:`prompt_arity`; the graph
    context is ``{}`` when the search did not use the graph) returns the user message (no
    system message) or a ``(system, user)`` pair."""
    if prompt is None:
        return prompts.answer_messages(question, chunks, skip_retrieval=skip_retrieval, graph=graph)
    if prompt_arity(prompt) == 3:
        result = prompt(question, list(chunks), dict(graph or {}))
    else:
        result = prompt(question, list(chunks))
    if isinstance(result, str):
        return None, result
    if isinstance(result, tuple) and len(result) == 2:
        return result[0], result[1]
    raise InvalidOption(
        "a prompt function must return a string (the prompt) or a (system, user) tuple, got "
        f"{type(result).__name__}"
    )


def _configured_prompt() -> PromptFunction | None:
    """``ASK["PROMPT"]``: a function or its dotted path, checked; None: the built-in."""
    spec = section_setting("ASK", "PROMPT")
    if spec is None:
        return None
    prompt = import_string(spec, setting="ASK.PROMPT") if isinstance(spec, str) else spec
    try:
        if not callable(prompt):
            raise InvalidOption(f"got {type(prompt).__name__}")
        prompt_arity(prompt)
    except InvalidOption as exc:
        raise ConfigurationError(
            "ASK.PROMPT",
            spec,
            f"{exc}; give a function (question, chunks) or (question, chunks, graph_context)",
        ) from exc
    return prompt


def prompt_arity(prompt: Callable[..., Any]) -> int:
    """2 or 3: how many arguments a custom answer prompt takes (``*args``: 3; parameters with
    defaults are left to them). Raises :class:`~django_rag.exceptions.InvalidOption` for
    anything else."""
    arity = call_arity(prompt, most=3, what="The prompt function") or 2
    if arity < 2:
        raise InvalidOption(
            "The prompt function takes one argument; it must take (question, chunks) or "
            "(question, chunks, graph_context)"
        )
    return arity


def make_answer(question: str, completion: Completion, chunks: list[SearchResult]) -> Answer:
    text = completion.text.strip()
    if not text:
        raise LLMResponseError("The LLM returned an empty answer.", model=completion.model)
    return Answer(
        question=question,
        text=text,
        chunks=chunks,
        citations=parse_citations(text, chunks),
        usage=completion.usage,
        model=completion.model,
    )


class AnswerStream:
    """What ``ask(..., stream=True)`` returns: iterate to get the answer text as it is written.

    When the iteration ends, :attr:`answer` holds the same :class:`Answer` that ``ask()``
    would have returned. Retrieval runs (and its errors are raised) when ``ask()`` is called.
    """

    def __init__(self, events: Iterator[Any]):
        self._events = events
        self.answer: Answer | None = None
        # Run up to the end of retrieval now, so bad input fails at the call site.
        next(self._events)

    def __iter__(self) -> Iterator[str]:
        try:
            while True:
                yield next(self._events)
        except StopIteration as stop:
            self.answer = stop.value

    def close(self) -> None:
        """Stop the answer where it is (the consumer went away): the LLM's stream is closed,
        and what it cost so far is recorded as usage (:class:`~django_rag.llm.TextStream`).
        :attr:`answer` stays None."""
        self._events.close()

    @property
    def chunks(self) -> list[SearchResult]:
        return self.answer.chunks if self.answer else []


_RETRIEVED = object()


def _check_history(history: Any) -> list[tuple[str, str]]:
    turns = []
    for turn in history or ():
        if (
            not isinstance(turn, tuple | list)
            or len(turn) != 2
            or turn[0] not in ("user", "assistant")
            or not isinstance(turn[1], str)
        ):
            raise InvalidOption(
                "history must be a list of (role, text) pairs, role 'user' or 'assistant'"
            )
        turns.append((turn[0], turn[1]))
    return turns


@accepts_aliases("ask()")
def ask(
    question: str,
    *,
    llm: Any = None,
    prompt: PromptFunction | None = None,
    stream: bool = False,
    global_search: bool = False,
    ground: Any = None,
    history: Sequence[tuple[str, str]] = (),
    **search_options: Unpack[SearchOptions],
) -> Answer | AnswerStream:
    """Answer ``question`` from the best ``limit`` chunks, citing them by number.

    Retrieval is :func:`django_rag.search` with the search options given
    (:class:`~django_rag.retrieval.options.SearchOptions`: ``mode``, ``collection``,
    ``source_id``, ``threshold``, ``reranker``, ``rewriter``, ``metadata``, ...), ``limit``
    ``DJANGO_RAG["ASK"]["LIMIT"]`` (5) unless given; an option :func:`~django_rag.search` does not take raises
    :class:`~django_rag.exceptions.InvalidOption` naming it and the accepted ones.
    The chunks reach the LLM as numbered, delimited sources; the answer cites them as ``[n]``
    and :attr:`Answer.citations` resolves each to its chunk, document, file and pages.
    ``prompt(question, chunks)`` or ``prompt(question, chunks, graph_context)`` replaces the
    default prompt (``graph_context``: what ``graph=True`` found, ``{}`` otherwise). ``stream=True`` returns an
    :class:`AnswerStream`. Raises :class:`~django_rag.exceptions.LLMNotConfigured` when no LLM
    is given or configured, before anything is searched.

    ``graph=True`` adds the graph path to retrieval and the matched entities, their
    relationships and community summaries to the prompt (``Answer.graph``).
    ``global_search=True`` answers a corpus-wide question from community summaries instead
    (map over the summaries, then reduce; no chunks, no citations).

    The ``ASK`` setting gives project-wide defaults of ``limit``, ``mode``, ``threshold``,
    ``prompt`` and ``ground`` for a call that leaves them unset (None).

    ``ground=True`` (the ``GROUNDER`` setting) or a grounder (alias, spec, function or
    :class:`~django_rag.answers.grounding.Grounder`) checks the answer against its chunks and
    sets :attr:`Answer.grounding`; a failing grounder leaves it None and a warning, never an
    exception.

    ``history``: earlier ``(role, text)`` turns of a conversation (oldest first), shown to the
    model before the question, quoted, as context (:func:`django_rag.chat` passes them).
    """
    if not isinstance(question, str) or not question.strip():
        raise InvalidInput("ask() needs a non-empty question string.")
    history = _check_history(history)
    question = clean_query(question)  # bounded and valid before any LLM or search sees it
    # A misspelled option or a bad value fails here, before any LLM call.
    request_options, components = split_options(search_options, "ask()")
    # The ASK setting fills what the call leaves unset (None or absent).
    defaults = call_defaults(
        "ASK",
        limit=request_options.get("limit"),
        mode=request_options.get("mode"),
        threshold=request_options.get("threshold"),
    )
    request_options.update({k: v for k, v in defaults.items() if v is not None})
    if ground is None:
        ground = section_setting("ASK", "GROUND")
    if prompt is None:
        prompt = _configured_prompt()
    elif not callable(prompt):
        raise InvalidOption(
            "prompt must be a function (question, chunks) or (question, chunks, graph_context) "
            f"returning the prompt, got {type(prompt).__name__}"
        )
    if prompt is not None:
        prompt_arity(prompt)  # a prompt that fits no call fails before any search
    request = build_request(question, **request_options)
    model = get_llm(llm, feature="ask()")
    grounder = None
    if ground is not False and ground is not None:
        grounder = get_grounder(ground, llm=model)  # a bad spec fails before any search
    if global_search:
        answer = global_answer(question, llm=model, collection=request_options.get("collection"))
        if grounder is not None:
            ground_answer(answer, grounder)
        return answer
    events = _ask(
        question,
        model,
        prompt,
        stream,
        grounder,
        history,
        request,
        components,
    )
    if stream:
        return AnswerStream(events)
    next(events)
    try:
        while True:
            next(events)
    except StopIteration as stop:
        return stop.value


def _ask(
    question: str,
    llm: LLM,
    prompt: PromptFunction | None,
    stream: bool,
    grounder: Grounder | None,
    history: list[tuple[str, str]],
    request: SearchRequest,
    components: SearchComponents,
):
    """Yields a marker once retrieval is done, then (streaming) text pieces; returns the Answer."""

    with span("ask", question=question, model=llm.model_name, stream=stream) as s:
        with collect_usage() as retrieval_usage:
            chunks, match = search_request(request, **components)
            graph = None
            if match is not None:
                graph = graph_context(match)
        yield _RETRIEVED
        system, user = answer_messages(question, chunks, prompt=prompt, graph=graph)
        system, user = prompts.with_history(system, user, history)
        if stream:
            text_stream = llm.stream(user, system=system, context=chunks, graph_context=graph)
            yield from text_stream
            completion = text_stream.completion
        else:
            completion = llm.complete(user, system=system, context=chunks, graph_context=graph)
        answer = make_answer(question, completion, chunks)
        answer.usage = retrieval_usage + completion.usage
        answer.graph = graph
        if grounder is not None:
            with collect_usage() as grounding_usage:
                ground_answer(answer, grounder)
            answer.usage = answer.usage + grounding_usage
            if answer.grounding is not None:  # None: the grounder failed (a warning says why)
                s.set(grounding_score=answer.grounding.score)
        s.set(
            context_count=len(chunks),
            citation_count=len(answer.citations),
            answer=answer.text,
            prompt_tokens=answer.usage.prompt_tokens,
            completion_tokens=answer.usage.completion_tokens,
            cost=answer.usage.cost,
        )
        return answer

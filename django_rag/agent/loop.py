"""A tool-calling agent: the model decides what to search, where, and when to stop.

::

    result = rag.Loop("Which plans include phone support?", collection=["plans", "faq"],
                      llm="openai/gpt-4o-mini", max_iterations=6).run()
    print(result.text, result.citations, result.stop_reason, result.tool_calls)

The controller LLM gets three built-in tools, ``search(query, limit[, collection])``,
``answer(text)`` and ``give_up(reason)``, plus any custom ones. Every search result is a
numbered source for the rest of the conversation; the chunks are deduplicated, capped at
``max_chunks`` and cited as ``[n]`` like :func:`~django_rag.ask`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Unpack

from ..answers.grounding import get_grounder
from ..conf import call_defaults, deadline_setting
from ..exceptions import InvalidInput, InvalidOption, UnknownCollection
from ..llm import LLM, get_llm
from ..models import Collection
from ..results import SearchResult
from ..retrieval.aliases import accepts_aliases
from ..retrieval.options import AgentSearchOptions
from ..retrieval.request import SearchRequest, build_request, request_option_names
from ..validation import clean_query
from .context import check_search_options
from .loop_run import LoopRun
from .loop_tools import (
    BUILTIN_TOOLS,
    KEEP_SOURCES,
    STOP_REASONS,
    LoopResult,
    Tool,
    ToolError,
    ToolStep,
    as_tool,
    check_history,
    check_temperatures,
)

# --- the loop -----------------------------------------------------------------------------------


class Loop(LoopRun):
    """A tool-calling agent over the stored documents.

    ``Loop(question, ...)`` checks and holds the options; :meth:`run` runs the loop and returns
    a :class:`LoopResult` (also kept as ``loop.result``). The run and its state come from
    :class:`~django_rag.agent.loop_run.LoopRun`; one Loop runs one conversation at a time.
    Options:

    - ``collection``: a name or list of names the model may search (None: every collection;
      an unknown name raises :class:`~django_rag.exceptions.UnknownCollection`). With one
      name ``search`` has no ``collection`` argument; a search naming a collection outside
      the list searches the first allowed one instead, with a note (nothing outside is
      searched).
    - ``llm``: the controller (it must call tools; backends without native tool calling use a
      prompted JSON protocol); ``answer_llm``: when given, it writes the final answer from the
      sources found and the conversation (earlier turns, the tool calls and what they
      returned, the controller's draft), each entry and the whole bounded.
    - ``tools``: custom tools (functions, :class:`Tool` objects or dicts, see :class:`Tool`).
    - ``max_iterations``: the most controller turns (default 10, as Arcana); when they run
      out, the answer is written from what was found. ``limit``: the default ``search``
      limit; ``max_limit`` the largest the model may ask for; ``max_chunks`` the most sources
      held (default 30, as Arcana).
    - ``system_prompt``: the controller's system message instead of the built-in one (a
      string, or a function ``loop -> str`` called when the run starts).
    - ``synthesizer``: a function ``(question, sources, messages) -> str`` that writes the
      answer when the turns run out (default: the ``answer_llm``, else the controller, from
      the sources and what the tools found); ``fallback_synthesis=False`` writes none (the
      result has no text). Nothing is written when nothing was found. Its failure is
      recorded on the result, never raised; a synthesis leaves a ``synthesis`` step in
      ``tool_calls``.
    - ``keep_sources``: which sources are kept once ``max_chunks`` are held: ``"best"``
      (default, as Arcana: a stronger new one sets the weakest held source aside; it keeps
      its number, and the answer is written from the held ones, strongest first) or
      ``"first"`` (later ones are dropped).
    - ``temperature``, ``controller_temperature``, ``answer_temperature`` (the
      ``answer_llm``'s rewrite), ``fallback_temperature`` (the answer written when the turns
      run out): sent with those calls; a role's own wins over ``temperature``; unset, none
      is sent.
    - ``ground``: ``True`` (the ``GROUNDER`` setting) or a grounder checks the final answer
      against the sources found (``result.grounding``; a failure is a warning; skipped when
      nothing was found). Each span's sources name the search that found them first
      (``search_iteration``, ``search_query``).
    - ``max_tool_calls``: the most tool calls run from one reply (default 10); the calls
      after them are not run and the model is told so. ``max_tool_result_chars``: the
      longest tool result sent to the model (default 100,000 characters); a longer one is cut
      there, with a note saying so.
    - ``history``: earlier turns of a conversation (``{"role": "user" | "assistant",
      "content": ...}`` dicts, oldest first), sent to the controller before the question.
    - ``threshold``, ``deadline`` and ``**search_options`` (mode, fusion, reranker...) as
      for :class:`~django_rag.Agent`; an option :func:`~django_rag.search` does not take
      raises :class:`~django_rag.exceptions.InvalidOption` here, not in every search.

    An option left None takes its project-wide default from ``DJANGO_RAG["LOOP"]``
    (``MAX_ITERATIONS``, ``LIMIT``, ``MAX_LIMIT``, ``MAX_CHUNKS``, ``MAX_TOOL_CALLS``,
    ``MAX_TOOL_RESULT_CHARS``, ``FALLBACK_SYNTHESIS``, ``KEEP_SOURCES``, ``LLM``,
    ``ANSWER_LLM``); the defaults above are that setting's.

    The deadline is checked before every controller turn and every tool call. Bad options
    raise at once; provider failures never raise from :meth:`run`: the result records them
    (``error``, ``stop_reason="error"``).
    """

    @accepts_aliases("Loop")
    def __init__(
        self,
        question: str,
        *,
        collection: str | Sequence[str] | None = None,
        llm: Any = None,
        answer_llm: Any = None,
        tools: Sequence[Any] = (),
        max_iterations: int | None = None,
        limit: int | None = None,
        max_limit: int | None = None,
        max_chunks: int | None = None,
        threshold: float | None = None,
        deadline: float | None = None,
        ground: Any = False,
        max_tool_calls: int | None = None,
        max_tool_result_chars: int | None = None,
        system_prompt: str | Callable[[Loop], str] | None = None,
        synthesizer: Callable[[str, list[SearchResult], list[dict[str, Any]]], str] | None = None,
        fallback_synthesis: bool | None = None,
        keep_sources: str | None = None,
        history: Sequence[dict[str, str]] = (),
        temperature: float | None = None,
        controller_temperature: float | None = None,
        answer_temperature: float | None = None,
        fallback_temperature: float | None = None,
        **search_options: Unpack[AgentSearchOptions],
    ):
        if not isinstance(question, str) or not question.strip():
            raise InvalidInput("Loop needs a non-empty question string.")
        self.question = clean_query(question)
        self.history = check_history(history)
        check_search_options(search_options, "Loop")
        # The LOOP setting fills the options the call leaves unset (None).
        d = call_defaults(
            "LOOP",
            max_iterations=max_iterations,
            limit=limit,
            max_limit=max_limit,
            max_chunks=max_chunks,
            max_tool_calls=max_tool_calls,
            max_tool_result_chars=max_tool_result_chars,
            fallback_synthesis=fallback_synthesis,
            keep_sources=keep_sources,
            llm=llm,
            answer_llm=answer_llm,
        )
        max_iterations, limit, max_limit, max_chunks = (
            d["max_iterations"], d["limit"], d["max_limit"], d["max_chunks"]
        )  # fmt: skip
        max_tool_calls, max_tool_result_chars = d["max_tool_calls"], d["max_tool_result_chars"]
        fallback_synthesis, keep_sources = d["fallback_synthesis"], d["keep_sources"]
        llm, answer_llm = d["llm"], d["answer_llm"]
        for name, value in (
            ("max_iterations", max_iterations),
            ("limit", limit),
            ("max_limit", max_limit),
            ("max_chunks", max_chunks),
            ("max_tool_calls", max_tool_calls),
            ("max_tool_result_chars", max_tool_result_chars),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOption(f"{name} must be a positive integer, got {value!r}")
        if limit > max_limit:
            raise InvalidOption(f"limit ({limit}) cannot exceed max_limit ({max_limit})")
        if system_prompt is not None and not callable(system_prompt):
            if not isinstance(system_prompt, str) or not system_prompt.strip():
                raise InvalidOption(
                    "system_prompt must be a non-empty string or a function loop -> str, got "
                    f"{system_prompt!r}"
                )
        if synthesizer is not None and not callable(synthesizer):
            raise InvalidOption(
                "synthesizer must be a function (question, sources, messages) -> str, got "
                f"{type(synthesizer).__name__}"
            )
        if not isinstance(fallback_synthesis, bool):
            raise InvalidOption(
                f"fallback_synthesis must be True or False, got {fallback_synthesis!r}"
            )
        if keep_sources not in KEEP_SOURCES:
            raise InvalidOption(
                f"keep_sources must be one of {', '.join(KEEP_SOURCES)}, got {keep_sources!r}"
            )
        self.temperatures = check_temperatures(
            all=temperature,
            controller=controller_temperature,
            answer=answer_temperature,
            fallback=fallback_temperature,
        )
        if isinstance(collection, str):
            scope: list[str] | None = [collection]
        elif collection is None:
            scope = None
        else:
            scope = list(dict.fromkeys(collection))
            if not scope or not all(isinstance(name, str) and name for name in scope):
                raise InvalidOption("collection must be a name or a non-empty list of names")
        if deadline is None:
            deadline = deadline_setting("AGENT_DEADLINE")
        elif isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise InvalidOption(f"deadline must be a positive number of seconds, got {deadline!r}")
        self.scope = scope
        # The search request every search of the loop varies (query, limit, collection):
        # options checked and the scope resolved once, here.
        components = {k: v for k, v in search_options.items() if k not in request_option_names()}
        self.request: SearchRequest = build_request(
            self.question,
            collection=scope,
            limit=limit,
            threshold=threshold,
            **{k: v for k, v in search_options.items() if k in request_option_names()},
        )
        self.components = components
        self.descriptions: dict[str, str] = {}
        self.collection_ids: dict[str, int] = {}
        if scope is not None:
            for name, description, pk in (
                Collection.objects.using(self.request.database)
                .filter(name__in=scope)
                .values_list("name", "description", "pk")
            ):
                self.descriptions[name] = description
                self.collection_ids[name] = pk
            missing = [name for name in scope if name not in self.descriptions]
            if missing:
                raise UnknownCollection(missing[0])
            self.request = replace(
                self.request,
                collection_ids=tuple(sorted(set(self.collection_ids.values()))),
            )
        self.llm: LLM = get_llm(llm, feature="Loop")
        self.answer_llm: LLM | None = (
            None if answer_llm is None else get_llm(answer_llm, feature="Loop's answer_llm")
        )
        self.tools = [as_tool(spec) for spec in tools]
        names = [tool.name for tool in self.tools]
        clash = sorted(set(names) & set(BUILTIN_TOOLS)) or sorted(
            {n for n in names if names.count(n) > 1}
        )
        if clash:
            raise InvalidOption(
                f"tool name {clash[0]!r} is taken (built-ins: {', '.join(BUILTIN_TOOLS)}; "
                "custom tool names must be unique)"
            )
        self.system_prompt = system_prompt
        self.synthesizer = synthesizer
        self.fallback_synthesis = fallback_synthesis
        self.keep_sources = keep_sources
        self.max_iterations = max_iterations
        self.limit = limit
        self.max_limit = max_limit
        self.max_chunks = max_chunks
        self.max_tool_calls = max_tool_calls
        self.max_tool_result_chars = max_tool_result_chars
        self.threshold = threshold
        self.deadline = deadline
        self.search_options = search_options
        # A bad grounder spec fails here; a failing grounder only leaves a warning.
        self.grounder = (
            None
            if ground is False or ground is None
            else get_grounder(ground, llm=self.answer_llm or self.llm)
        )
        self.result: LoopResult | None = None

    def __repr__(self) -> str:
        return f"<Loop question={self.question[:40]!r} collections={self.scope!r}>"


def run_loop(question: str, **options: Any) -> LoopResult:
    """``Loop(question, **options).run()``: the loop as one function call."""
    return Loop(question, **options).run()


__all__ = [
    "BUILTIN_TOOLS",
    "KEEP_SOURCES",
    "STOP_REASONS",
    "Loop",
    "LoopResult",
    "Tool",
    "ToolError",
    "ToolStep",
    "run_loop",
]

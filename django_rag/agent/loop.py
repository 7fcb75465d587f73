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

import inspect
import json
import logging
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..answers.grounding import get_grounder, ground_answer
from ..answers.service import answer_messages, parse_citations
from ..conf import deadline_setting, scrub_text
from ..exceptions import (
    AgentTimeout,
    InvalidInput,
    InvalidOption,
    LLMError,
    LLMTimeout,
    UnknownCollection,
)
from ..llm import (
    LLM,
    ToolCall,
    collect_usage,
    deadline,
    get_llm,
    tool_message,
    tool_schema,
)
from ..llm.parsing import value_too_large
from ..models import Collection
from ..results import Answer, SearchResult
from ..retrieval.aliases import accepts_aliases
from ..retrieval.service import (
    SearchRequest,
    build_request,
    normalize_collections,
    request_option_names,
    search_request,
)
from ..signals import span
from ..validation import clean_query
from . import prompts
from .context import check_search_options

logger = logging.getLogger(__name__)

BUILTIN_TOOLS = ("search", "answer", "give_up")

#: Why a loop stopped (:attr:`LoopResult.stop_reason`).
STOP_REASONS = ("answer", "give_up", "max_iterations", "deadline", "error")


class ToolError(Exception):
    """Raise from a custom tool to send the model an error result (the loop goes on)."""


# --- custom tools -------------------------------------------------------------------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass
class Tool:
    """A custom tool: a plain function and the JSON schema of its keyword arguments.

    ``Tool.from_function(func)`` builds the schema from the signature (``str``, ``int``,
    ``float``, ``bool``, ``list`` and ``dict`` annotations; parameters without a default are
    required) and the description from the docstring; pass ``parameters`` to give your own.
    The function is called with the model's arguments as keywords and returns a string, a
    JSON-able value, or a list of :class:`~django_rag.SearchResult` (which become numbered
    sources like search results). Raising :class:`ToolError` (or anything else) sends the
    model an error result.
    """

    name: str
    function: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_function(
        cls,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> Tool:
        if not callable(function):
            raise InvalidOption(f"a tool must be a function, got {type(function).__name__}")
        name = name or getattr(function, "__name__", "")
        if not name or not name.replace("_", "").isalnum():
            raise InvalidOption(f"a tool needs a name of letters, digits and _, got {name!r}")
        if description is None:
            description = inspect.getdoc(function) or ""
        return cls(name, function, description, parameters or _parameters_of(function))

    def schema(self) -> dict[str, Any]:
        return tool_schema(self.name, self.description, self.parameters)


def _parameters_of(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # unresolvable annotations: leave the types out
        hints = {}
    properties: dict[str, Any] = {}
    required = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        hint = typing.get_origin(hints.get(parameter.name)) or hints.get(parameter.name)
        prop: dict[str, Any] = {}
        if hint in _JSON_TYPES:
            prop["type"] = _JSON_TYPES[hint]
        elif hint is list:
            prop["type"] = "array"
        elif hint is dict:
            prop["type"] = "object"
        properties[parameter.name] = prop
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _as_tool(spec: Any) -> Tool:
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, dict) and "function" in spec:
        options = {k: spec[k] for k in ("name", "description", "parameters") if k in spec}
        return Tool.from_function(spec["function"], **options)
    if callable(spec):
        return Tool.from_function(spec)
    raise InvalidOption(
        "tools must be functions, Tool objects or {'function': ..., 'parameters': ...} dicts, "
        f"got {type(spec).__name__}"
    )


def _check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the (simple) JSON ``schema``, or None when they do."""
    properties = schema.get("properties") or {}
    problems = [
        f"missing required argument {name!r}"
        for name in schema.get("required") or []
        if name not in arguments
    ]
    if schema.get("additionalProperties") is False:
        problems += [
            f"unknown argument {name!r} (expected: {', '.join(properties) or 'none'})"
            for name in arguments
            if name not in properties
        ]
    for name, value in arguments.items():
        spec = properties.get(name) or {}
        expected = spec.get("type")
        if expected and not _has_type(value, expected):
            problems.append(f"{name!r} must be of type {expected}, got {json.dumps(value)}")
        elif "enum" in spec and value not in spec["enum"]:
            problems.append(
                f"{name!r} must be one of {', '.join(map(json.dumps, spec['enum']))}, "
                f"got {json.dumps(value)}"
            )
    return "; ".join(problems) or None


def _has_type(value: Any, expected: str | list[str]) -> bool:
    if isinstance(expected, list):
        return any(_has_type(value, one) for one in expected)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    checks = {"string": str, "boolean": bool, "array": list, "object": dict}
    if expected == "null":
        return value is None
    return isinstance(value, checks[expected]) if expected in checks else True


# --- the result ---------------------------------------------------------------------------------


@dataclass
class ToolStep:
    """One tool call of a loop: what the model asked for and what it was told."""

    iteration: int
    id: str
    name: str
    arguments: dict[str, Any]
    result: str
    error: str | None = None
    chunk_ids: list[Any] = field(default_factory=list)
    new_chunk_ids: list[Any] = field(default_factory=list)
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "result": self.result,
            "error": self.error,
            "chunk_ids": list(self.chunk_ids),
            "new_chunk_ids": list(self.new_chunk_ids),
            "duration": self.duration,
        }


@dataclass
class LoopResult(Answer):
    """What :meth:`Loop.run` returns: an :class:`~django_rag.agent.Answer` (text, chunks,
    citations, usage) plus the work that led to it.

    ``chunks`` are every source found, in the order found (source ``[n]`` is
    ``chunks[n - 1]``); ``tool_calls`` is the trace of :class:`ToolStep`; ``messages`` is the
    controller's whole conversation (OpenAI message dicts); ``stop_reason`` is one of
    :data:`STOP_REASONS`; ``error`` holds the provider error (or deadline) that stopped it.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[ToolStep] = field(default_factory=list)
    iterations: int = 0
    stop_reason: str = ""
    error: Exception | None = None
    give_up_reason: str | None = None
    collections: list[str] | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the loop ended with an answer text and no error."""
        return self.error is None and bool(self.text)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            messages=self.messages,
            tool_calls=[step.to_dict() for step in self.tool_calls],
            iterations=self.iterations,
            stop_reason=self.stop_reason,
            error=None
            if self.error is None
            else f"{type(self.error).__name__}: {scrub_text(self.error)}",
            give_up_reason=self.give_up_reason,
            collections=self.collections,
            warnings=list(self.warnings),
        )
        return data


# --- the loop -----------------------------------------------------------------------------------


class Loop:
    """A tool-calling agent over the stored documents.

    ``Loop(question, ...)`` checks and holds the options; :meth:`run` runs the loop and returns
    a :class:`LoopResult` (also kept as ``loop.result``). Options:

    - ``collection``: a name or list of names the model may search (None: every collection;
      an unknown name raises :class:`~django_rag.exceptions.UnknownCollection`). A search
      naming any other collection gets an error result; nothing outside is searched.
    - ``llm``: the controller (it must call tools; backends without native tool calling use a
      prompted JSON protocol); ``answer_llm``: when given, it writes the final answer from the
      sources found (the controller only searches), with :func:`~django_rag.ask`'s prompt.
    - ``tools``: custom tools (functions, :class:`Tool` objects or dicts, see :class:`Tool`).
    - ``max_iterations``: the most controller turns; when they run out, the answer is
      written from what was found. ``limit``: the default ``search`` limit; ``max_limit`` the
      largest the model may ask for; ``max_chunks`` the most sources kept in all.
    - ``ground``: ``True`` (the ``GROUNDER`` setting) or a grounder checks the final answer
      against the sources found (``result.grounding``; a failure is a warning).
    - ``max_tool_calls``: the most tool calls run from one reply (default 10); the calls
      after them are not run and the model is told so. ``max_tool_result_chars``: the
      longest tool result sent to the model (default 100,000 characters); a longer one is cut
      there, with a note saying so.
    - ``history``: earlier turns of a conversation (``{"role": "user" | "assistant",
      "content": ...}`` dicts, oldest first), sent to the controller before the question.
    - ``threshold``, ``deadline`` and ``**search_options`` (mode, fusion, reranker...) as
      for :class:`~django_rag.Agent`; an option :func:`~django_rag.search` does not take
      raises :class:`~django_rag.exceptions.InvalidOption` here, not in every search.

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
        max_iterations: int = 5,
        limit: int = 5,
        max_limit: int = 20,
        max_chunks: int = 20,
        threshold: float | None = None,
        deadline: float | None = None,
        ground: Any = False,
        max_tool_calls: int = 10,
        max_tool_result_chars: int = 100_000,
        history: Sequence[dict[str, str]] = (),
        **search_options: Any,
    ):
        if not isinstance(question, str) or not question.strip():
            raise InvalidInput("Loop needs a non-empty question string.")
        self.question = clean_query(question)
        self.history = _history(history)
        check_search_options(search_options, "Loop")
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
        self.tools = [_as_tool(spec) for spec in tools]
        names = [tool.name for tool in self.tools]
        clash = sorted(set(names) & set(BUILTIN_TOOLS)) or sorted(
            {n for n in names if names.count(n) > 1}
        )
        if clash:
            raise InvalidOption(
                f"tool name {clash[0]!r} is taken (built-ins: {', '.join(BUILTIN_TOOLS)}; "
                "custom tool names must be unique)"
            )
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

    # --- the schemas the model sees

    def _schemas(self) -> list[dict[str, Any]]:
        collection: dict[str, Any] = {
            "type": "string",
            "description": "Search only this collection (default: every one you may search).",
        }
        if self.scope is not None:
            collection["enum"] = list(self.scope)
        search_schema = tool_schema(
            "search",
            "Search the documents; returns numbered sources.",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {
                        "type": "integer",
                        "description": f"How many results (1-{self.max_limit}, default "
                        f"{self.limit}).",
                    },
                    "collection": collection,
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        )
        answer_schema = tool_schema(
            "answer",
            "Give the final answer, citing sources as [n]. Ends the conversation.",
            {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The answer."}},
                "required": ["text"],
                "additionalProperties": False,
            },
        )
        give_up_schema = tool_schema(
            "give_up",
            "Stop without an answer when the documents do not cover the question.",
            {
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why."}},
                "required": ["reason"],
                "additionalProperties": False,
            },
        )
        return [search_schema, answer_schema, give_up_schema] + [t.schema() for t in self.tools]

    def _system(self) -> str:
        described = None
        if self.scope is not None:
            described = [(name, self.descriptions.get(name, "")) for name in self.scope]
        return prompts.loop_system(
            described, self.max_iterations, [tool.name for tool in self.tools]
        )

    # --- running

    def run(self) -> LoopResult:
        """Run the loop; returns (and keeps in ``self.result``) a :class:`LoopResult`."""
        run = _Run(self)
        with span(
            "agent.loop",
            question=self.question,
            model=self.llm.model_name,
            max_iterations=self.max_iterations,
            collections=self.scope,
            tools=[tool.name for tool in self.tools],
        ) as s:
            with collect_usage() as usage, deadline(at=run.deadline_at):
                run.loop()
                run.finish()
                if self.grounder is not None and run.result.text:
                    ground_answer(run.result, self.grounder)
            result = run.result
            result.usage = usage
            s.set(
                iterations=result.iterations,
                stop_reason=result.stop_reason,
                tool_call_count=len(result.tool_calls),
                chunk_count=len(result.chunks),
                citation_count=len(result.citations),
                error=None if result.error is None else type(result.error).__name__,
                answer=result.text,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cost=usage.cost,
                grounding_score=None if result.grounding is None else result.grounding.score,
            )
        self.result = result
        return result

    def __repr__(self) -> str:
        return f"<Loop question={self.question[:40]!r} collections={self.scope!r}>"


def _history(history: Any) -> list[dict[str, str]]:
    """Earlier turns of a conversation (``Loop(history=...)``): ``{"role": "user" |
    "assistant", "content": str}`` dicts, oldest first, sent before the question."""
    turns = []
    for turn in history:
        if (
            not isinstance(turn, dict)
            or turn.get("role") not in ("user", "assistant")
            or not isinstance(turn.get("content"), str)
        ):
            raise InvalidOption(
                "history must be a list of {'role': 'user' | 'assistant', 'content': str} dicts"
            )
        turns.append({"role": turn["role"], "content": turn["content"]})
    return turns


class _Run:
    """The state of one run of a :class:`Loop`."""

    def __init__(self, loop: Loop):
        self.loop_ = loop
        self.deadline_at = (
            None if loop.deadline is None else time.monotonic() + float(loop.deadline)
        )
        self.chunks: list[SearchResult] = []
        self.numbers: dict[Any, int] = {}
        self.tools = {tool.name: tool for tool in loop.tools}
        self.schemas = loop._schemas()
        self.parameters = {s["function"]["name"]: s["function"]["parameters"] for s in self.schemas}
        # The collection scope is enforced by search() itself (with a message naming the
        # collections allowed), not only by the schema's enum, which a model may ignore.
        search_parameters = json.loads(json.dumps(self.parameters["search"]))
        search_parameters["properties"]["collection"].pop("enum", None)
        self.parameters["search"] = search_parameters
        self.result = LoopResult(
            question=loop.question,
            text="",
            collections=None if loop.scope is None else list(loop.scope),
            model=loop.llm.model_name,
        )
        self.result.messages = [
            {"role": "system", "content": loop._system()},
            *loop.history,
            {"role": "user", "content": loop.question},
        ]
        self.done = False

    # --- the controller's turns

    def loop(self) -> None:
        loop, result = self.loop_, self.result
        while not self.done:
            if result.iterations >= loop.max_iterations:
                result.stop_reason = "max_iterations"
                self.synthesise()
                return
            if self.deadline_passed():
                return
            result.iterations += 1
            try:
                reply = loop.llm.chat(result.messages, tools=self.schemas)
            except LLMError as exc:
                self.fail(exc)
                return
            except Exception as exc:  # a custom backend's bug is a provider failure too
                self.fail(
                    LLMError(
                        f"The controller LLM {loop.llm.model_name!r} raised "
                        f"{type(exc).__name__}: {scrub_text(exc)[:500]}",
                        model=loop.llm.model_name,
                    )
                )
                return
            calls = list(reply.tool_calls)
            dropped = len(calls) - loop.max_tool_calls
            if dropped > 0:
                # Only the calls that are run stay in the conversation (each needs a result).
                calls = calls[: loop.max_tool_calls]
                reply.tool_calls = calls
                result.warnings.append(
                    f"the model asked for {len(calls) + dropped} tool calls in one reply; "
                    f"the {dropped} after the first {loop.max_tool_calls} were not run"
                )
            result.messages.append(reply.message())
            if not calls:
                if reply.text.strip():
                    # A model that answers in plain text has answered.
                    result.warnings.append("the model answered in text, not with the answer tool")
                    self.set_answer(reply.text)
                    return
                result.messages.append(
                    {"role": "user", "content": "Call one of the tools: search, answer or give_up."}
                )
                continue
            timed_out = False
            for index, call in enumerate(calls):
                if not self.done and not timed_out and self.deadline_passed():
                    timed_out = True
                if timed_out:
                    step = self.step(call, "Not run: the loop's deadline had passed.")
                elif self.done:
                    step = self.step(call, "Not run: the conversation had already ended.")
                else:
                    step = self.call(call)
                if dropped > 0 and index == len(calls) - 1:
                    step.result += (
                        f"\n(Your reply asked for {len(calls) + dropped} tool calls; only the "
                        f"first {loop.max_tool_calls} were run. Ask for at most "
                        f"{loop.max_tool_calls} at a time.)"
                    )
                result.tool_calls.append(step)
                result.messages.append(tool_message(call.id, step.result))
            if timed_out:
                return

    def deadline_passed(self) -> bool:
        """True (and the run stopped on its deadline) once the deadline has passed."""
        if self.deadline_at is None or time.monotonic() < self.deadline_at:
            return False
        result = self.result
        result.stop_reason = "deadline"
        result.error = AgentTimeout(
            f"The loop passed its deadline ({self.loop_.deadline:g}s) after "
            f"{result.iterations} turn(s) and {len(result.tool_calls)} tool call(s). Raise "
            "DJANGO_RAG['AGENT_DEADLINE'] or Loop(deadline=...), or lower max_iterations."
        )
        return True

    def fail(self, exc: Exception) -> None:
        passed = self.deadline_at is not None and time.monotonic() >= self.deadline_at
        # A call cut short by the loop's own deadline is the deadline, not a provider failure.
        self.result.stop_reason = "deadline" if isinstance(exc, LLMTimeout) and passed else "error"
        self.result.error = exc
        logger.warning(
            "django_rag loop stopped on an LLM error: %s: %s",
            type(exc).__name__,
            scrub_text(exc)[:500],
        )

    def step(self, call: ToolCall, result: str, error: str | None = None, **extra) -> ToolStep:
        return ToolStep(
            self.result.iterations, call.id, call.name, call.arguments, result, error, **extra
        )

    def call(self, call: ToolCall) -> ToolStep:
        started = time.perf_counter()
        arguments = call.arguments
        with span(
            "agent.loop.tool",
            tool=call.name,
            call_id=call.id,
            iteration=self.result.iterations,
            query=arguments.get("query") if call.name == "search" else None,
            collection=arguments.get("collection") if call.name == "search" else None,
        ) as s:
            try:
                if call.error:
                    raise ToolError(f"{call.error}; send the arguments as a JSON object")
                if call.name not in self.parameters:
                    raise ToolError(
                        f"there is no tool {call.name!r}; the tools are "
                        + ", ".join(self.parameters)
                    )
                problem = _check_arguments(arguments, self.parameters[call.name])
                if problem:
                    raise ToolError(f"bad arguments for {call.name}: {problem}")
                text, found = self.dispatch(call.name, arguments)
                step = self.step(call, text)
                if found is not None:
                    step.chunk_ids, step.new_chunk_ids = found
            except Exception as exc:
                message = (
                    scrub_text(exc)[:1000]
                    if isinstance(exc, ToolError)
                    else (f"{type(exc).__name__}: {scrub_text(exc)[:1000]}")
                )
                if not isinstance(exc, ToolError):
                    logger.warning("django_rag loop tool %s failed: %s", call.name, message)
                step = self.step(call, f"Error: {message}", message)
            step.result = self.capped(step.result)
            step.duration = time.perf_counter() - started
            s.set(
                error=step.error is not None,
                chunk_count=len(step.chunk_ids),
                new_chunk_count=len(step.new_chunk_ids),
            )
        return step

    def capped(self, text: str) -> str:
        """``text`` cut at ``max_tool_result_chars``, with a note saying so."""
        limit = self.loop_.max_tool_result_chars
        if len(text) <= limit:
            return text
        return (
            text[:limit] + f"\n[Truncated: the result had {len(text):,} characters; only the first "
            f"{limit:,} are shown.]"
        )

    def dispatch(self, name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
        if name == "search":
            return self.search(**arguments)
        if name == "answer":
            text = arguments["text"].strip()
            if not text:
                raise ToolError("answer needs a non-empty text")
            self.set_answer(text)
            return "Answer recorded.", None
        if name == "give_up":
            reason = arguments["reason"].strip() or "The model gave up without a reason."
            self.result.stop_reason = "give_up"
            self.result.give_up_reason = reason
            self.result.text = reason
            self.done = True
            return "Stopped.", None
        value = self.tools[name].function(**arguments)
        if isinstance(value, list) and value and all(isinstance(v, SearchResult) for v in value):
            return self.register(value)
        if isinstance(value, str):
            return value, None
        problem = value_too_large(value)
        if problem:
            raise ToolError(f"the tool's result cannot be sent: {problem}")
        return json.dumps(value, default=str), None

    def search(
        self, query: str, limit: int | None = None, collection: str | None = None
    ) -> tuple[str, Any]:
        loop = self.loop_
        if not query.strip():
            raise ToolError("search needs a non-empty query")
        if limit is None:
            limit = loop.limit
        if limit < 1:
            raise ToolError(f"limit must be at least 1, got {limit}")
        limit = min(limit, loop.max_limit)
        request = replace(loop.request, query=clean_query(query), limit=limit)
        if collection is not None:
            if loop.scope is not None and collection not in loop.scope:
                # The scope is enforced here, not by the schema: a model may name anything.
                raise ToolError(
                    f"collection {collection!r} is not one you may search; choose from "
                    + ", ".join(loop.scope)
                )
            request = replace(
                request,
                collections=tuple(normalize_collections(collection) or ()),
                collection_ids=(
                    (loop.collection_ids[collection],) if loop.scope is not None else None
                ),
            )
        found, _ = search_request(request, **loop.components)
        return self.register(found)

    def register(self, found: list[SearchResult]) -> tuple[str, tuple[list, list]]:
        """Number the chunks (a chunk seen before keeps its number), up to ``max_chunks``."""
        numbered, ids, new, dropped = [], [], [], 0
        for chunk in found:
            number = self.numbers.get(chunk.chunk_id)
            if number is not None:
                numbered.append((number, chunk, True))
                ids.append(chunk.chunk_id)
                continue
            if len(self.chunks) >= self.loop_.max_chunks:
                dropped += 1
                continue
            self.chunks.append(chunk)
            number = self.numbers[chunk.chunk_id] = len(self.chunks)
            numbered.append((number, chunk, False))
            ids.append(chunk.chunk_id)
            new.append(chunk.chunk_id)
        if not numbered and not dropped:
            return "No results.", (ids, new)
        text = prompts.loop_sources(numbered) if numbered else ""
        notes = [f"{len(new)} new source(s), {len(ids) - len(new)} found earlier."]
        if dropped:
            notes.append(
                f"{dropped} more result(s) dropped: the limit of {self.loop_.max_chunks} "
                "sources is reached. Answer from the sources you have."
            )
        return (text + "\n" if text else "") + " ".join(notes), (ids, new)

    def set_answer(self, text: str) -> None:
        self.result.stop_reason = "answer"
        self.result.text = text.strip()
        self.done = True

    # --- the end

    def synthesise(self) -> None:
        """Write the answer from the sources found (max_iterations, or an ``answer_llm``)."""
        loop = self.loop_
        llm = loop.answer_llm or loop.llm
        system, user = answer_messages(loop.question, self.chunks)
        try:
            completion = llm.complete(user, system=system)
        except LLMError as exc:
            self.result.error = exc
            logger.warning(
                "django_rag loop could not write its answer: %s: %s",
                type(exc).__name__,
                scrub_text(exc)[:500],
            )
            return
        self.result.text = completion.text.strip()
        self.result.model = completion.model or llm.model_name

    def finish(self) -> None:
        result = self.result
        if result.stop_reason == "answer" and self.loop_.answer_llm is not None:
            self.synthesise()
        result.chunks = list(self.chunks)
        if result.stop_reason != "give_up":
            result.citations = parse_citations(result.text, result.chunks)


def run_loop(question: str, **options: Any) -> LoopResult:
    """``Loop(question, **options).run()``: the loop as one function call."""
    return Loop(question, **options).run()


__all__ = [
    "BUILTIN_TOOLS",
    "STOP_REASONS",
    "Loop",
    "LoopResult",
    "Tool",
    "ToolError",
    "ToolStep",
    "run_loop",
]

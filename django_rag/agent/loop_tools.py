"""The :class:`~django_rag.agent.loop.Loop`'s tools and result: custom tools (:class:`Tool`,
their JSON schemas and the check of a model's arguments against them), the built-in tools'
schemas, the check of ``history``, :class:`ToolStep` and :class:`LoopResult`."""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..conf import scrub_text
from ..exceptions import InvalidOption
from ..llm import tool_schema
from ..results import Answer

BUILTIN_TOOLS = ("search", "answer", "give_up")

#: Why a loop stopped (:attr:`LoopResult.stop_reason`).
STOP_REASONS = ("answer", "give_up", "max_iterations", "deadline", "error")

#: Which sources a loop keeps once ``max_chunks`` are held (:class:`Loop`'s ``keep_sources``).
KEEP_SOURCES = ("first", "best")


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


def as_tool(spec: Any) -> Tool:
    """A :class:`Tool` from what ``Loop(tools=[...])`` takes: a Tool, a function or a dict."""
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


def check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
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


def builtin_schemas(scope: list[str] | None, limit: int, max_limit: int) -> list[dict[str, Any]]:
    """The schemas of the built-in tools (``search``, ``answer``, ``give_up``) as the model
    sees them; ``scope`` (None: every collection) lists the collections ``search`` may name.
    With a single collection ``search`` has no ``collection`` argument (there is no choice)."""
    properties: dict[str, Any] = {
        "query": {"type": "string", "description": "What to look for."},
        "limit": {
            "type": "integer",
            "description": f"How many results (1-{max_limit}, default {limit}).",
        },
    }
    if scope is None or len(scope) > 1:
        collection: dict[str, Any] = {
            "type": "string",
            "description": "Search only this collection (default: every one you may search).",
        }
        if scope is not None:
            collection["enum"] = list(scope)
        properties["collection"] = collection
    search_schema = tool_schema(
        "search",
        "Search the documents; returns numbered sources.",
        {
            "type": "object",
            "properties": properties,
            "required": ["query"],
            "additionalProperties": False,
        },
    )
    answer_schema = _text_tool(
        "answer", "Give the final answer, citing sources as [n]. Ends the conversation.",
        "text", "The answer.",
    )  # fmt: skip
    give_up_schema = _text_tool(
        "give_up", "Stop without an answer when the documents do not cover the question.",
        "reason", "Why.",
    )  # fmt: skip
    return [search_schema, answer_schema, give_up_schema]


def _text_tool(name: str, description: str, argument: str, about: str) -> dict[str, Any]:
    """The schema of a built-in tool that takes one required string argument."""
    return tool_schema(
        name,
        description,
        {
            "type": "object",
            "properties": {argument: {"type": "string", "description": about}},
            "required": [argument],
            "additionalProperties": False,
        },
    )


def cap_result(text: str, limit: int) -> str:
    """A tool's result cut at ``limit`` characters (``max_tool_result_chars``), with a note
    saying so."""
    if len(text) <= limit:
        return text
    return (
        text[:limit] + f"\n[Truncated: the result had {len(text):,} characters; only the first "
        f"{limit:,} are shown.]"
    )


def check_history(history: Any) -> list[dict[str, str]]:
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


def check_temperatures(**roles: Any) -> dict[str, float | None]:
    """The Loop's temperatures by role (``all``, ``controller``, ``answer``, ``fallback``):
    each None or a number from 0 to 2."""
    for role, value in roles.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
            name = "temperature" if role == "all" else f"{role}_temperature"
            raise InvalidOption(f"{name} must be a number from 0 to 2, got {value!r}")
    return {role: None if value is None else float(value) for role, value in roles.items()}


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
    # keep_sources="best": the numbers of the sources set aside for stronger ones.
    set_aside: list[int] = field(default_factory=list)

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
            set_aside=list(self.set_aside),
        )
        return data

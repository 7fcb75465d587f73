"""The LLM base class, completions, usage accounting and streaming."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..conf import deadline_setting
from ..exceptions import LLMResponseError
from ..results import Usage
from ..signals import span
from .errors import LLMTimeout
from .parsing import (
    MAX_JSON_CHARS,
    MAX_JSON_DEPTH,
    json_depth_exceeds,
    parse_json,
    value_too_large,
)
from .prompting import tool_protocol_messages


@dataclass
class Completion:
    """The text of one LLM call and what it cost."""

    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    #: Why the model stopped, as the provider says (``"stop"``, ``"length"`` when the token
    #: limit cut the reply, ``"tool_calls"``...); None when the backend does not say.
    finish_reason: str | None = field(default=None, kw_only=True)


@dataclass
class ToolCall:
    """One tool call the model asked for: its ``id``, the tool ``name`` and the ``arguments``.

    ``arguments`` is the parsed JSON object (empty when it could not be parsed);
    ``raw_arguments`` is the text the model sent, and ``error`` says why it did not parse.
    Arguments are model output: longer than ``MAX_JSON_CHARS`` characters, nested deeper than
    ``MAX_JSON_DEPTH`` levels (:mod:`django_rag.llm.parsing`) or not JSON-able, they are
    refused (``arguments`` empty, ``error`` set) before anything recurses into them.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""
    error: str | None = None

    def __post_init__(self) -> None:
        # Calls a backend or a chat function built directly are checked like parsed ones.
        problem = None
        if not isinstance(self.arguments, dict):
            problem = "the arguments must be a JSON object"
        else:
            problem = value_too_large(self.arguments)
            problem = problem and f"the arguments were refused: {problem}"
        if problem is None and not isinstance(self.raw_arguments, str):
            problem = "the raw arguments must be a string"
        if problem is None and len(self.raw_arguments) > MAX_JSON_CHARS:
            problem = (
                f"the arguments were refused: they have {len(self.raw_arguments):,} "
                f"characters, more than {MAX_JSON_CHARS:,}"
            )
        if problem is not None:
            self.arguments = {}
            if not isinstance(self.raw_arguments, str) or len(self.raw_arguments) > MAX_JSON_CHARS:
                self.raw_arguments = ""
            self.error = self.error or problem

    @classmethod
    def parse(cls, id: str, name: str, arguments: Any) -> ToolCall:
        """A call from a provider's ``arguments``: a JSON string (as OpenAI sends) or a dict."""
        if isinstance(arguments, dict):
            problem = value_too_large(arguments)
            if problem:
                return cls(str(id), str(name), {}, "", f"the arguments were refused: {problem}")
            try:
                raw = json.dumps(arguments)
            except (TypeError, ValueError) as exc:
                return cls(str(id), str(name), {}, "", f"the arguments are not JSON ({exc})")
            return cls(str(id), str(name), dict(arguments), raw)
        raw = "" if arguments is None else str(arguments)
        if not raw.strip():
            return cls(str(id), str(name), {}, raw)
        if len(raw) > MAX_JSON_CHARS:
            # __post_init__ refuses it, and does not keep the text.
            return cls(str(id), str(name), {}, raw)
        if json_depth_exceeds(raw):
            return cls(
                str(id),
                str(name),
                {},
                raw,
                f"the arguments were refused: they are nested more than {MAX_JSON_DEPTH} "
                "levels deep",
            )
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return cls(str(id), str(name), {}, raw, f"the arguments are not valid JSON ({exc})")
        if not isinstance(value, dict):
            return cls(str(id), str(name), {}, raw, "the arguments must be a JSON object")
        return cls(str(id), str(name), value, raw)

    def to_dict(self) -> dict[str, Any]:
        """The call in OpenAI's message format (``function.arguments`` a JSON string)."""
        raw = self.raw_arguments or json.dumps(self.arguments, default=str)
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": raw},
        }


@dataclass
class ToolCompletion(Completion):
    """What :meth:`LLM.chat` returns: text and/or the tool calls the model asked for."""

    tool_calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation before the tools' results."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return message


_TOOL_TAG = "<tool_call>"


def tool_calls_in_text(
    text: str, tools: list[dict[str, Any]], *, id_prefix: str = "call"
) -> list[ToolCall]:
    """Tool calls a model wrote as text instead of through the provider's tool channel.

    Small local models often reply with ``{"name": ..., "arguments": {...}}`` (bare, in a
    Markdown fence, or in ``<tool_call>`` tags) when the server does not parse them. Only a
    reply that *is* such a call (it starts with ``{``, a fence or the tag) and names one of the
    offered ``tools`` counts, so an answer that merely quotes JSON stays an answer. Bounded by
    :func:`~django_rag.llm.parsing.parse_json`'s caps; at most 8 calls.
    """
    names = {(tool.get("function") or {}).get("name") for tool in tools if isinstance(tool, dict)}
    stripped = (text or "").strip()
    if not names or not stripped or len(stripped) > MAX_JSON_CHARS:
        return []
    if not stripped.startswith(("{", "```", _TOOL_TAG)):
        return []
    bodies = (
        [part.split("</tool_call>", 1)[0] for part in stripped.split(_TOOL_TAG)[1:9]]
        if stripped.startswith(_TOOL_TAG)
        else [stripped]
    )
    calls: list[ToolCall] = []
    for index, body in enumerate(bodies):
        try:
            value = parse_json(body)
        except LLMResponseError:
            continue
        items = value.get("tool_calls") if isinstance(value.get("tool_calls"), list) else [value]
        for item in items[:8]:
            if not isinstance(item, dict) or item.get("name") not in names:
                continue
            arguments = item.get("arguments", item.get("parameters", {}))
            calls.append(
                ToolCall.parse(f"{id_prefix}_{index}_{len(calls)}", item["name"], arguments)
            )
    return calls[:8]


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    """The message that gives the model the result of its tool call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's schema in the OpenAI ``tools`` format (``parameters`` is a JSON schema)."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# --- usage collection ---------------------------------------------------------------------------

_collectors: contextvars.ContextVar[tuple[_Collector, ...]] = contextvars.ContextVar(
    "django_rag_usage_collectors", default=()
)


class _Collector:
    def __init__(self) -> None:
        self.usage = Usage()
        self._lock = threading.Lock()

    def add(self, usage: Usage) -> None:
        with self._lock:
            self.usage.add(usage)


class UsageMeter:
    """Sums the usage of every LLM call made while it is :meth:`active`, however many times
    it is entered: a streamed answer runs a piece at a time (each piece inside
    ``meter.active()``), and the meter holds what every piece cost, including the estimate a
    stream records when it is cut or dropped (:class:`TextStream`)."""

    def __init__(self) -> None:
        self._collector = _Collector()

    @property
    def usage(self) -> Usage:
        return self._collector.usage

    @contextmanager
    def active(self) -> Iterator[Usage]:
        token = _collectors.set((*_collectors.get(), self._collector))
        try:
            yield self._collector.usage
        finally:
            _collectors.reset(token)


@contextmanager
def collect_usage() -> Iterator[Usage]:
    """Sum the usage of every LLM call made inside the block (nested blocks all see it).

    Calls made in worker threads are counted when the thread runs in a copy of the caller's
    context (``contextvars.copy_context().run``), as django_rag's own thread pools do.
    """
    with UsageMeter().active() as usage:
        yield usage


def record_usage(usage: Usage) -> None:
    for collector in _collectors.get():
        collector.add(usage)


# --- deadlines ---------------------------------------------------------------------------------

# The monotonic time by which the current LLM answer (or agent run) must be done, or None.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "django_rag_deadline", default=None
)


def _earliest(*ends: float | None) -> float | None:
    known = [end for end in ends if end is not None]
    return min(known) if known else None


@contextmanager
def deadline(seconds: float | None = None, *, at: float | None = None) -> Iterator[float | None]:
    """Within the block, LLM calls must finish ``seconds`` from now (or by the monotonic time
    ``at``); an enclosing, earlier deadline still wins. Yields the effective deadline.

    The agent wraps each run in one (``AGENT_DEADLINE``); every LLM answer gets its own
    ``LLM_DEADLINE`` on top. Backends read what is left with :func:`remaining_time`.
    """
    end = _earliest(
        _deadline.get(),
        at,
        None if seconds is None else time.monotonic() + seconds,
    )
    token = _deadline.set(end)
    try:
        yield end
    finally:
        _deadline.reset(token)


def remaining_time() -> float | None:
    """Seconds left before the current deadline (negative once passed), or None."""
    end = _deadline.get()
    return None if end is None else end - time.monotonic()


def _answer_deadline() -> float | None:
    """The monotonic end of one LLM answer: ``LLM_DEADLINE`` from now, or the enclosing one."""

    seconds = deadline_setting("LLM_DEADLINE")
    return _earliest(_deadline.get(), None if seconds is None else time.monotonic() + seconds)


# --- the base class ----------------------------------------------------------------------------


Messages = list[dict[str, Any]]


def _ends_json(text: str) -> bool:
    """Whether a reply ends as a JSON value (or a fence around one) does."""
    return text.rstrip().rstrip("`").rstrip().endswith(("}", "]"))


def estimate_tokens(chars: int) -> int:
    """Tokens in ``chars`` characters of text, estimated at four characters a token (rounded
    up), where no tokenizer of the model is at hand."""
    return -(-max(0, chars) // 4)


def build_messages(prompt: str, system: str | None) -> Messages:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return messages


class LLM:
    """Base class of LLM backends.

    Subclasses implement :meth:`_complete` (and :meth:`_stream` to stream natively); callers use
    :meth:`complete` and :meth:`stream`, which add telemetry and usage accounting. Keep secrets
    out of ``repr`` and error messages, and do no I/O in ``__init__``.
    """

    model_name: str = "custom"
    #: Whether :meth:`_complete` and :meth:`_stream` take the ``context`` (a list of chunks)
    #: and ``graph_context`` keywords of the call (:class:`~django_rag.llm.CallableLLM` does).
    takes_context: bool = False

    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        json_object: bool = False,
        context: Sequence[Any] | None = None,
        graph_context: dict[str, Any] | None = None,
        **options: Any,
    ) -> Completion:
        """Send ``prompt`` (the user message) with an optional ``system`` message.

        ``json_object=True`` says the caller wants one JSON object back: backends that can
        enforce it (see :meth:`json_options`) are asked to; the reply is still parsed
        tolerantly, so backends that cannot lose nothing.

        ``context``: the chunks (:class:`~django_rag.SearchResult`) the call is about, and
        ``graph_context`` what the graph found for ``ask()``. The prompt already holds what
        the model must read; they reach backends that set :attr:`takes_context` (a function
        LLM taking ``(prompt, context)`` or ``(prompt, context, opts)``), and the span's
        ``context_count``.
        """
        messages = build_messages(prompt, system)
        if json_object:
            options = {**self.json_options(messages), **options}
        extra = self._context_options(context, graph_context)
        with span("llm.complete", **self._span_metadata(messages, context)) as s:
            end = _answer_deadline()
            if end is not None and time.monotonic() >= end:
                raise LLMTimeout(
                    "No time was left for this LLM call (its deadline had passed); raise "
                    "DJANGO_RAG['LLM_DEADLINE'] / ['AGENT_DEADLINE'] or ask again.",
                    model=self.model_name,
                )
            with deadline(at=end):
                completion = self._complete(messages, **extra, **options)
            self._finish(s, completion)
        return completion

    def _context_options(
        self, context: Sequence[Any] | None, graph_context: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The ``context``/``graph_context`` keywords for :meth:`_complete`/:meth:`_stream`
        (only a backend that sets :attr:`takes_context` gets them: the others would send
        unknown options to their provider)."""
        if not self.takes_context:
            return {}
        return {"context": list(context or ()), "graph_context": graph_context}

    def complete_json(
        self,
        prompt: str,
        *,
        system: str | None = None,
        expect: type | None = dict,
        context: Sequence[Any] | None = None,
        **options: Any,
    ) -> Any:
        """:meth:`complete`, then :func:`~django_rag.llm.parse_json` of the reply: the JSON
        value of type ``expect`` (``dict``, ``list`` or None for any). An object is asked for
        in JSON mode where the backend has one (``json_object=True``). A reply the token limit
        cut before its JSON ended raises
        :class:`~django_rag.exceptions.LLMResponseError` saying so (not a parse error about a
        fragment)."""
        completion = self.complete(
            prompt, system=system, json_object=expect is dict, context=context, **options
        )
        text = completion.text
        if completion.finish_reason == "length" and not _ends_json(text):
            raise LLMResponseError(
                f"The LLM's reply was cut at its token limit "
                f"({completion.usage.completion_tokens or '?'} tokens) before its JSON ended; "
                "raise the LLM's max_tokens.",
                text=text,
                model=completion.model or self.model_name,
            )
        return parse_json(text, expect=expect)

    def stream(
        self,
        prompt: str,
        *,
        system: str | None = None,
        context: Sequence[Any] | None = None,
        graph_context: dict[str, Any] | None = None,
        **options: Any,
    ) -> TextStream:
        """Like :meth:`complete`, but iterate over the returned stream to get text as it arrives.

        After the iteration ends, ``stream.completion`` holds the whole :class:`Completion`.
        """
        messages = build_messages(prompt, system)
        extra = self._context_options(context, graph_context)
        return TextStream(self, messages, {**extra, **options}, context_count=len(context or ()))

    def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, **options: Any
    ) -> ToolCompletion:
        """Send a conversation (OpenAI-style message dicts) with the ``tools`` the model may
        call (OpenAI-style schemas, see :func:`tool_schema`).

        Returns a :class:`ToolCompletion`: text, tool calls, or both. Append its
        :meth:`~ToolCompletion.message` and one :func:`tool_message` per call to continue the
        conversation. Backends with native tool calling implement :meth:`_chat`; the others
        get a prompted JSON protocol over :meth:`_complete` (see :meth:`_chat`).
        """
        messages = [dict(message) for message in messages]
        tools = list(tools or [])
        with span("llm.complete", tools=len(tools), **self._span_metadata(messages)) as s:
            end = _answer_deadline()
            if end is not None and time.monotonic() >= end:
                raise LLMTimeout(
                    "No time was left for this LLM call (its deadline had passed); raise "
                    "DJANGO_RAG['LLM_DEADLINE'] / ['AGENT_DEADLINE'] or ask again.",
                    model=self.model_name,
                )
            with deadline(at=end):
                completion = self._chat(messages, tools, **options)
            self._finish(s, completion)
            s.set(tool_calls=[call.name for call in completion.tool_calls])
        return completion

    def json_options(self, messages: Messages) -> dict[str, Any]:
        """The options that make this backend reply with one JSON object (JSON mode), sent
        with :meth:`complete` ``(json_object=True)``. None here; a backend that can constrain
        its output overrides it."""
        return {}

    def _complete(self, messages: Messages, **options: Any) -> Completion:
        raise NotImplementedError

    def _chat(
        self, messages: Messages, tools: list[dict[str, Any]], **options: Any
    ) -> ToolCompletion:
        """Tool calling for backends without it: the tools are described in the system
        message, the conversation is flattened into text, and a reply holding
        ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` is read as tool calls (any
        other reply is text). A ``tool_choice`` is not sent: the protocol cannot force one."""
        options.pop("tool_choice", None)
        flat = tool_protocol_messages(messages, tools)
        completion = self._complete(flat, **options)
        calls: list[ToolCall] = []
        if tools and "tool_calls" in completion.text:
            try:
                data = parse_json(completion.text)
            except LLMResponseError:
                data = {}
            for index, raw in enumerate(data.get("tool_calls") or []):
                if isinstance(raw, dict) and raw.get("name"):
                    calls.append(
                        ToolCall.parse(
                            f"call_{len(messages)}_{index}", raw["name"], raw.get("arguments")
                        )
                    )
        text = "" if calls else completion.text
        return ToolCompletion(
            text,
            completion.usage,
            completion.model or self.model_name,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
        )

    def _stream(self, messages: Messages, **options: Any) -> Iterator[str | Usage]:
        """Yield text pieces, and optionally a final :class:`Usage`. Default: one piece."""
        completion = self._complete(messages, **options)
        yield completion.text
        yield completion.usage

    def _span_metadata(
        self, messages: Messages, context: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "prompt_chars": sum(len(m.get("content") or "") for m in messages),
            "prompt": messages[-1].get("content") or "",
            "context_count": len(context or ()),
        }

    def _finish(self, s, completion: Completion) -> None:
        record_usage(completion.usage)
        s.set(
            response_chars=len(completion.text),
            answer=completion.text,
            prompt_tokens=completion.usage.prompt_tokens,
            completion_tokens=completion.usage.completion_tokens,
            cost=completion.usage.cost,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model_name!r}>"


class TextStream:
    """Iterate to receive text as the LLM writes it; ``completion`` is set when it ends."""

    def __init__(
        self, llm: LLM, messages: Messages, options: dict[str, Any], *, context_count: int = 0
    ):
        self._llm = llm
        self._messages = messages
        self._options = options
        self._context_count = context_count
        self.completion: Completion | None = None
        self._started = False

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a TextStream can be iterated only once")
        self._started = True
        llm = self._llm
        with span(
            "llm.complete",
            stream=True,
            **{**llm._span_metadata(self._messages), "context_count": self._context_count},
        ) as s:
            end = _answer_deadline()
            pieces: list[str] = []
            usage = Usage()
            items = llm._stream(self._messages, **self._options)
            complete = False
            try:
                while True:
                    self._check_deadline(end, pieces)
                    # The deadline is visible to the backend only while it produces a piece:
                    # it must not leak into the consumer's code between pieces.
                    token = _deadline.set(end)
                    try:
                        item = next(items)
                    except StopIteration:
                        break
                    finally:
                        _deadline.reset(token)
                    if isinstance(item, Usage):
                        usage = item
                    elif item:
                        pieces.append(item)
                        yield item
                complete = True
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
                known = usage.calls or usage.total_tokens
                if not complete and (pieces or known):
                    # Cut, timed out, or dropped by the consumer (GeneratorExit) after it
                    # began: the provider was paid for the prompt and the words written so
                    # far. (One that failed before its first word, refused, costs nothing.)
                    record_usage(usage if known else self._estimate(pieces))
            self.completion = Completion("".join(pieces), usage, llm.model_name)
            llm._finish(s, self.completion)

    def _estimate(self, pieces: list[str]) -> Usage:
        """What a stream that did not finish cost, as far as it went: its prompt and the text
        written so far, at four characters a token (the provider's usage comes only with the
        last chunk)."""
        prompt = sum(len(str(m.get("content") or "")) for m in self._messages)
        written = sum(len(piece) for piece in pieces)
        return Usage.of_call(
            self._llm.model_name, estimate_tokens(prompt), estimate_tokens(written), None
        )

    def _check_deadline(self, end: float | None, pieces: list[str]) -> None:
        if end is not None and time.monotonic() > end:
            raise LLMTimeout(
                f"The LLM's streamed answer passed its deadline after {len(''.join(pieces))} "
                "characters; the text so far is incomplete. Raise DJANGO_RAG['LLM_DEADLINE'] "
                "(or the agent's deadline) or ask again.",
                model=self._llm.model_name,
            )


def map_concurrently(func: Callable[[Any], Any], items: list[Any], max_workers: int) -> list[Any]:
    """``[func(item) for item in items]`` on at most ``max_workers`` threads, results in order.

    Each call runs in a copy of the caller's context, so usage collection and telemetry see it.
    """
    if max_workers <= 1 or len(items) <= 1:
        return [func(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, func, item) for item in items]
        return [future.result() for future in futures]

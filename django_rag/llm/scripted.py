"""An LLM that answers from a script (alias ``"scripted"``; re-exported by
:mod:`django_rag.testing`, where tests find it)."""

from __future__ import annotations

import re
import threading
from typing import Any

from ..exceptions import LLMError
from .base import LLM, Completion, Messages, ToolCall, ToolCompletion, Usage


class ScriptedLLM(LLM):
    """An LLM that answers from a script and records every call.

    ``responses`` are used in order, one per call. ``rules`` maps a substring to a response used
    (repeatedly) whenever the prompt or system message contains it; rules are checked first.
    ``default`` answers when nothing else does (otherwise the call fails the test with an
    AssertionError). A response is a string, an exception (raised as
    :class:`~django_rag.exceptions.LLMError` like a real backend's failure) or a callable
    ``prompt -> str``. Each call reports one token per word of prompt and answer.

    ``calls`` lists ``{"prompt": ..., "system": ...}`` dicts in call order, with ``options``
    when the call passed any (such as ``temperature``).

    Tool calling (:meth:`~django_rag.llm.LLM.chat`) takes responses from the same script. A
    response there may also be a tool call ``("search", {"query": "refunds"})``, a
    :class:`~django_rag.llm.ToolCall`, a list of those (several calls in one reply), or a
    :class:`~django_rag.llm.ToolCompletion`; a string is a text reply; a callable gets the
    list of messages and returns any of these. Calls get ids ``call_1``, ``call_2``... and
    the recorded call also holds ``messages`` and ``tools`` (the tool names offered).
    """

    def __init__(
        self,
        *responses,
        rules: dict[str, object] | None = None,
        default: object | None = None,
        model_name: str = "scripted",
        cost_per_call: float | None = None,
    ):
        self.responses = list(responses)
        self.rules = dict(rules or {})
        self.default = default
        self.model_name = model_name
        self.cost_per_call = cost_per_call
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._call_ids = 0

    def _next(self, prompt: str, system: str | None) -> object:
        with self._lock:
            self.calls.append({"prompt": prompt, "system": system})
            for needle, response in self.rules.items():
                if needle in prompt or (system and needle in system):
                    return response
            if self.responses:
                return self.responses.pop(0)
            if self.default is not None:
                return self.default
        raise AssertionError(f"ScriptedLLM has no response left for prompt: {prompt[:200]!r}")

    def _complete(self, messages: Messages, **options) -> Completion:
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        prompt = messages[-1]["content"]
        response = self._next(prompt, system)
        if options:
            with self._lock:
                self.calls[-1]["options"] = dict(options)
        if isinstance(response, type) and issubclass(response, BaseException):
            response = response("scripted failure")
        if isinstance(response, LLMError):
            raise response
        if isinstance(response, BaseException):
            raise LLMError(f"scripted failure: {response!r}", model=self.model_name)
        text = response(prompt) if callable(response) else str(response)
        usage = Usage.of_call(
            self.model_name,
            len("\n".join(m["content"] for m in messages).split()),
            len(text.split()),
            self.cost_per_call,
        )
        return Completion(text, usage, self.model_name)

    def _chat(self, messages: Messages, tools: list[dict[str, Any]], **options) -> ToolCompletion:
        system = messages[0].get("content") if messages[0].get("role") == "system" else None
        prompt = messages[-1].get("content") or ""
        response = self._next(prompt, system)
        with self._lock:
            self.calls[-1]["messages"] = [dict(m) for m in messages]
            self.calls[-1]["tools"] = [tool["function"]["name"] for tool in tools]
            self.calls[-1]["options"] = dict(options)
        if isinstance(response, type) and issubclass(response, BaseException):
            response = response("scripted failure")
        if isinstance(response, LLMError):
            raise response
        if isinstance(response, BaseException):
            raise LLMError(f"scripted failure: {response!r}", model=self.model_name)
        if callable(response):
            response = response(messages)
        if isinstance(response, ToolCompletion):
            return response
        calls: list[ToolCall] = []
        text = ""
        if isinstance(response, str):
            text = response
        else:
            items = response if isinstance(response, list) else [response]
            calls = [self._tool_call(item) for item in items]
        usage = Usage.of_call(
            self.model_name,
            len("\n".join(m.get("content") or "" for m in messages).split()),
            len(text.split()) + sum(len(call.raw_arguments.split()) for call in calls),
            self.cost_per_call,
        )
        return ToolCompletion(
            text,
            usage,
            self.model_name,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
        )

    def _tool_call(self, item: Any) -> ToolCall:
        if isinstance(item, ToolCall):
            return item
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            with self._lock:
                self._call_ids += 1
                number = self._call_ids
            return ToolCall.parse(f"call_{number}", item[0], item[1])
        raise AssertionError(
            f"ScriptedLLM: {item!r} is not a tool call; use (name, arguments) or a ToolCall"
        )

    def _stream(self, messages: Messages, **options):
        completion = self._complete(messages, **options)
        # Stream word by word (whitespace kept) like a real model writes.
        yield from re.findall(r"\S+\s*|\s+", completion.text)
        yield completion.usage

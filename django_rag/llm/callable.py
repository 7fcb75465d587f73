"""A plain Python callable used as an LLM."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..conf import scrub_text
from ..exceptions import LLMError
from ..utils import call_arity, keyword_parameters
from .base import LLM, Completion, Messages, ToolCall, ToolCompletion, Usage
from .errors import LLMStreamError


class CallableLLM(LLM):
    """Wraps ``func(prompt) -> str``, ``func(prompt, context)`` or
    ``func(prompt, context, opts)``, chosen once by the function's required positional
    parameters (``*args`` counts as three; parameters with defaults are left to them).

    ``context`` is the list of :class:`~django_rag.SearchResult` the call is about (empty
    when it has none); ``opts`` a new dict of the call's options (``temperature``...), plus
    ``graph_context`` when ``ask()``'s search used the graph. A one- or two-argument
    function gets the options it names (all, with ``**kwargs``) as keyword arguments; the
    others are not sent. A function that fits none of these raises
    :class:`~django_rag.exceptions.InvalidOption` when it is given. The system
    message, when there is one, is put before the user message in the one prompt
    string. ``func`` may also return a :class:`Completion` (to report usage) or an iterator of
    text pieces (to stream). Exceptions become :class:`~django_rag.exceptions.LLMError`.

    Tool calling (:meth:`~django_rag.llm.LLM.chat`) uses the prompted JSON protocol through
    ``func``, unless ``chat(messages, tools)`` is given: it returns a
    :class:`~django_rag.llm.ToolCompletion`, a string (text), or a list of
    ``(name, arguments)`` tool calls. A ``chat`` taking a third positional argument (or
    ``*args``) is called ``chat(messages, tools, options)``: the call's options as a dict
    (``temperature``, ``tool_choice``...), as Arcana calls a 3-argument controller.
    """

    takes_context = True

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        model_name: str | None = None,
        chat: Callable[[Messages, list[dict[str, Any]]], Any] | None = None,
    ):
        if not callable(func):
            raise TypeError("CallableLLM needs a callable")
        if chat is not None and not callable(chat):
            raise TypeError("CallableLLM's chat must be a callable (messages, tools)")
        self.func = func
        self.chat_func = chat
        self.chat_takes_options = chat is not None and _takes_third_argument(chat)
        self.model_name = model_name or getattr(func, "__qualname__", None) or "function"
        self.arity = call_arity(func, most=3, what="The LLM function") or 1
        # Before arities, options reached a one-argument function as keyword arguments: those
        # it names (or all, with **kwargs) still do; a three-argument one gets them in opts.
        self.keywords = (
            frozenset() if self.arity == 3 else keyword_parameters(func, skip=self.arity)
        )

    def _call(
        self,
        messages: Messages,
        options: dict[str, Any],
        context: Sequence[Any] | None = None,
        graph_context: dict[str, Any] | None = None,
    ) -> Any:
        prompt = "\n\n".join(message["content"] for message in messages)
        args: list[Any] = [prompt]
        if self.arity >= 2:
            args.append(list(context or ()))
        if self.arity == 3:
            opts = dict(options)
            if graph_context is not None:
                opts["graph_context"] = graph_context
            args.append(opts)
        if self.arity < 3 and options:
            keywords = {
                k: v for k, v in options.items() if self.keywords is None or k in self.keywords
            }
        else:
            keywords = {}
        try:
            return self.func(*args, **keywords)
        except LLMError:
            raise
        except Exception as exc:
            raise LLMError(
                f"LLM function {self.model_name!r} raised {type(exc).__name__}: "
                f"{scrub_text(exc)[:500]}",
                model=self.model_name,
            ) from exc

    def _chat(
        self, messages: Messages, tools: list[dict[str, Any]], **options: Any
    ) -> ToolCompletion:
        if self.chat_func is None:
            return super()._chat(messages, tools, **options)
        try:
            if self.chat_takes_options:
                result = self.chat_func(messages, tools, dict(options))
            else:
                result = self.chat_func(messages, tools)
        except LLMError:
            raise
        except Exception as exc:
            raise LLMError(
                f"LLM chat function {self.model_name!r} raised {type(exc).__name__}: "
                f"{scrub_text(exc)[:500]}",
                model=self.model_name,
            ) from exc
        usage = Usage.of_call(self.model_name, 0, 0, None)
        if isinstance(result, ToolCompletion):
            return result
        if isinstance(result, str):
            return ToolCompletion(result, usage, self.model_name, finish_reason="stop")
        if isinstance(result, list) and all(
            isinstance(item, tuple) and len(item) == 2 for item in result
        ):
            calls = [
                ToolCall.parse(f"call_{len(messages)}_{index}", name, arguments)
                for index, (name, arguments) in enumerate(result)
            ]
            return ToolCompletion(
                "", usage, self.model_name, tool_calls=calls, finish_reason="tool_calls"
            )
        raise LLMError(
            f"LLM chat function {self.model_name!r} returned {type(result).__name__}; return a "
            "ToolCompletion, a string or a list of (name, arguments) tool calls",
            model=self.model_name,
        )

    def _complete(
        self,
        messages: Messages,
        *,
        context: Sequence[Any] | None = None,
        graph_context: dict[str, Any] | None = None,
        **options: Any,
    ) -> Completion:
        result = self._call(messages, options, context, graph_context)
        if isinstance(result, Completion):
            return result
        if isinstance(result, str):
            return Completion(result, Usage.of_call(self.model_name, 0, 0, None), self.model_name)
        if result is None:
            return Completion("", Usage.of_call(self.model_name, 0, 0, None), self.model_name)
        if isinstance(result, Iterator):
            return Completion(
                "".join(result), Usage.of_call(self.model_name, 0, 0, None), self.model_name
            )
        raise LLMError(
            f"LLM function {self.model_name!r} returned {type(result).__name__}; "
            "return a string, a Completion or an iterator of strings",
            model=self.model_name,
        )

    def _stream(
        self,
        messages: Messages,
        *,
        context: Sequence[Any] | None = None,
        graph_context: dict[str, Any] | None = None,
        **options: Any,
    ) -> Iterator[str | Usage]:
        result = self._call(messages, options, context, graph_context)
        if isinstance(result, Iterator):
            received: list[str] = []
            try:
                for piece in result:
                    received.append(piece if isinstance(piece, str) else "")
                    yield piece
            except LLMError:
                raise
            except Exception as exc:
                raise LLMStreamError(
                    f"LLM function {self.model_name!r} failed mid-stream with "
                    f"{type(exc).__name__}: {scrub_text(exc)[:500]}; the answer is incomplete.",
                    model=self.model_name,
                    partial="".join(received),
                ) from exc
            yield Usage.of_call(self.model_name, 0, 0, None)
        else:
            completion = (
                result
                if isinstance(result, Completion)
                else Completion(str(result or ""), Usage.of_call(self.model_name, 0, 0, None))
            )
            yield completion.text
            yield completion.usage


def _takes_third_argument(func: Callable[..., Any]) -> bool:
    """Whether ``func`` can be called with three positional arguments (a third positional
    parameter, with or without a default, or ``*args``)."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the two-argument way
        return False
    kind = inspect.Parameter
    positional = [
        p for p in parameters if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 3 or any(p.kind == kind.VAR_POSITIONAL for p in parameters)

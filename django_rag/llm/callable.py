"""A plain Python callable used as an LLM."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..conf import scrub_text
from ..exceptions import LLMError
from .base import LLM, Completion, Messages, Usage
from .errors import LLMStreamError


class CallableLLM(LLM):
    """Wraps ``func(prompt) -> str``.

    The system message, when there is one, is put before the user message in the one prompt
    string. ``func`` may also return a :class:`Completion` (to report usage) or an iterator of
    text pieces (to stream). Exceptions become :class:`~django_rag.exceptions.LLMError`.
    """

    def __init__(self, func: Callable[[str], Any], *, model_name: str | None = None):
        if not callable(func):
            raise TypeError("CallableLLM needs a callable")
        self.func = func
        self.model_name = model_name or getattr(func, "__qualname__", None) or "function"

    def _call(self, messages: Messages, options: dict[str, Any]) -> Any:
        prompt = "\n\n".join(message["content"] for message in messages)
        try:
            return self.func(prompt, **options) if options else self.func(prompt)
        except LLMError:
            raise
        except Exception as exc:
            raise LLMError(
                f"LLM function {self.model_name!r} raised {type(exc).__name__}: "
                f"{scrub_text(exc)[:500]}",
                model=self.model_name,
            ) from exc

    def _complete(self, messages: Messages, **options: Any) -> Completion:
        result = self._call(messages, options)
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

    def _stream(self, messages: Messages, **options: Any) -> Iterator[str | Usage]:
        result = self._call(messages, options)
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

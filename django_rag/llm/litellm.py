"""Any chat model litellm supports: OpenAI, Anthropic, Ollama, Azure, Bedrock, vLLM, ..."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..exceptions import LLMError, MissingDependency
from .base import LLM, Completion, Messages, Usage

logger = logging.getLogger(__name__)

# Failures worth another attempt; anything else (bad request, auth, unknown model) is final.
_TRANSIENT = (
    "RateLimitError",
    "Timeout",
    "APIConnectionError",
    "ServiceUnavailableError",
    "InternalServerError",
    "BadGatewayError",
)


def _litellm():
    try:
        import litellm
    except ImportError as exc:
        raise MissingDependency("litellm", "llm", "The litellm LLM backend") from exc
    # litellm prints a "give feedback" banner on every error; our errors say what to do.
    litellm.suppress_debug_info = True
    return litellm


def call_with_retries(
    call: Callable[[], Any],
    *,
    model: str,
    max_retries: int,
    backoff: float,
    max_backoff: float,
    secret: str | None = None,
) -> Any:
    """Run a litellm call, retrying transient failures with exponential backoff and jitter.

    A ``Retry-After`` header is honoured up to ``max_backoff``. Raises :class:`LLMError` (with
    ``secret`` removed from the message) when a failure is final or the retries run out.
    """
    litellm = _litellm()
    transient = tuple(getattr(litellm, name) for name in _TRANSIENT if hasattr(litellm, name))
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except transient as exc:
            if attempt > max_retries:
                raise _error(exc, attempt, model, secret) from None
            delay = _delay(exc, attempt, backoff, max_backoff)
            logger.warning(
                "LLM %s: transient %s, retry %d/%d in %.1fs",
                model,
                type(exc).__name__,
                attempt,
                max_retries,
                delay,
            )
            time.sleep(delay)
        except Exception as exc:
            raise _error(exc, attempt, model, secret) from None


def _delay(exc: Exception, attempt: int, backoff: float, max_backoff: float) -> float:
    retry_after = None
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is not None:
        try:
            retry_after = float(headers.get("retry-after"))
        except (TypeError, ValueError):
            retry_after = None
    if retry_after is None:
        retry_after = backoff * 2 ** (attempt - 1) * (0.5 + random.random())
    return max(0.0, min(retry_after, max_backoff))


def _error(exc: Exception, attempt: int, model: str, secret: str | None) -> LLMError:
    message = str(exc)
    if secret:
        message = message.replace(secret, "[REDACTED]")
    return LLMError(
        f"LLM call to {model!r} failed after {attempt} attempt(s): "
        f"{type(exc).__name__}: {message[:500]}",
        model=model,
        attempts=attempt,
    )


class LiteLLM(LLM):
    """Chat completions through ``litellm.completion``.

    ``model`` is a litellm model string (``"openai/gpt-4o-mini"``, ``"anthropic/claude-..."``,
    ``"ollama/llama3.1"``). Transient failures (rate limits, timeouts, connection errors, 5xx)
    are retried ``max_retries`` times with exponential backoff starting at ``backoff`` seconds
    (a ``Retry-After`` header is honoured up to ``max_backoff``). Other options (``temperature``,
    ``max_tokens``, ``extra``) are sent with every call. ``api_key`` never appears in ``repr``,
    logs or error messages.
    """

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        api_base: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra: dict[str, Any] | None = None,
    ):
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty litellm model string")
        self.model_name = model
        self._api_key = api_key
        self.api_base = api_base
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra = dict(extra or {})

    def _kwargs(self, messages: Messages, options: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "messages": messages,
            "timeout": self.timeout,
            # Retries are ours (counted, logged, backoff); stop the SDK from retrying as well.
            "max_retries": 0,
            **self.extra,
        }
        if self._api_key:
            kwargs["api_key"] = self._api_key
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        kwargs.update(options)
        return kwargs

    def _call(self, kwargs: dict[str, Any]) -> Any:
        return call_with_retries(
            lambda: _litellm().completion(**kwargs),
            model=self.model_name,
            max_retries=self.max_retries,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            secret=self._api_key,
        )

    def _error(self, exc: Exception, attempt: int) -> LLMError:
        return _error(exc, attempt, self.model_name, self._api_key)

    def _usage(self, usage: Any) -> Usage:
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = None
        try:
            prompt_cost, completion_cost = _litellm().cost_per_token(
                model=self.model_name,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
            cost = float(prompt_cost + completion_cost)
        except Exception:  # litellm raises for models missing from its price map
            cost = None
        return Usage.of_call(self.model_name, prompt_tokens, completion_tokens, cost)

    def _complete(self, messages: Messages, **options: Any) -> Completion:
        response = self._call(self._kwargs(messages, options))
        text = response.choices[0].message.content or ""
        return Completion(text, self._usage(getattr(response, "usage", None)), self.model_name)

    def _stream(self, messages: Messages, **options: Any) -> Iterator[str | Usage]:
        kwargs = self._kwargs(messages, options)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        usage = None
        try:
            for chunk in self._call(kwargs):
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
                choices = getattr(chunk, "choices", None) or []
                if choices and choices[0].delta and choices[0].delta.content:
                    yield choices[0].delta.content
        except LLMError:
            raise
        except Exception as exc:  # the connection broke mid-stream
            raise self._error(exc, 1) from None
        yield self._usage(usage)

    def __repr__(self) -> str:
        return f"<LiteLLM model={self.model_name!r} api_base={self.api_base!r}>"

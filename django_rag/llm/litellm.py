"""Any chat model litellm supports: OpenAI, Anthropic, Ollama, Azure, Bedrock, vLLM, ..."""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..conf import scrub_text, secrets_in
from ..exceptions import LLMAuthenticationError, LLMError, LLMResponseError, MissingDependency
from .base import (
    LLM,
    Completion,
    Messages,
    ToolCall,
    ToolCompletion,
    Usage,
    remaining_time,
    tool_calls_in_text,
)
from .errors import LLMStreamError, LLMTimeout

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

# Credential failures: no retry can fix them, whatever class litellm gives them. litellm maps
# some by status (AuthenticationError for 401), leaves others generic (a 403 from an
# OpenAI-compatible server is a plain APIError), and reports a key missing before any request
# as an InternalServerError, which would otherwise be retried as transient.
_AUTH_CLASSES = ("AuthenticationError", "PermissionDeniedError")
_AUTH_STATUS = (401, 403)
_MISSING_KEY = re.compile(
    r"missing credentials|api_key client option must be set|missing [\w ]{0,20}api[ _]?key"
    r"|no api[ _]?key|api[ _]?key (?:is |was )?(?:missing|required|not (?:set|found|provided))",
    re.IGNORECASE,
)


def _litellm():
    return import_litellm("The litellm LLM backend")


def import_litellm(feature: str):
    """litellm, imported for ``feature`` (named in the :class:`MissingDependency` raised when
    it is not installed).

    Unless the environment says otherwise, litellm reads its bundled price list instead of
    fetching the newest one as it is imported (on a machine without network that fetch waits,
    then prints warnings). ``LITELLM_LOCAL_MODEL_COST_MAP=False`` asks for the fetch.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        raise MissingDependency("litellm", "llm", feature) from exc
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
    secret: str | Iterable[str] | None = None,
) -> Any:
    """Run a litellm call, retrying transient failures with exponential backoff and jitter.

    A ``Retry-After`` header is honoured up to ``max_backoff``. Retries stop when the current
    deadline (:func:`~django_rag.llm.base.deadline`) would pass before the next attempt:
    :class:`LLMTimeout` is raised then. Raises :class:`LLMError` when a failure is final or
    the retries run out. Error messages never show ``secret`` (a string or strings) nor the
    configured secrets (:func:`django_rag.conf.scrub_text`).
    """
    litellm = _litellm()
    transient = tuple(getattr(litellm, name) for name in _TRANSIENT if hasattr(litellm, name))
    auth = tuple(getattr(litellm, name) for name in _AUTH_CLASSES if hasattr(litellm, name))
    attempt = 0
    while True:
        attempt += 1
        left = remaining_time()
        if left is not None and left <= 0:
            raise LLMTimeout(
                f"LLM call to {model!r} passed its deadline before attempt {attempt}; raise "
                "DJANGO_RAG['LLM_DEADLINE'] (or the agent's deadline) or try again later.",
                model=model,
                attempts=attempt - 1,
            )
        try:
            return call()
        except Exception as exc:
            if _is_auth_failure(exc, auth):
                raise _auth_error(exc, attempt, model, secret) from None
            if not isinstance(exc, transient) or attempt > max_retries:
                raise _error(exc, attempt, model, secret) from None
            delay = _delay(exc, attempt, backoff, max_backoff)
            left = remaining_time()
            if left is not None and delay >= left:
                raise _error(exc, attempt, model, secret, timeout=True) from None
            logger.warning(
                "LLM %s: transient %s, retry %d/%d in %.1fs",
                model,
                type(exc).__name__,
                attempt,
                max_retries,
                delay,
            )
            time.sleep(delay)


def _is_auth_failure(exc: Exception, auth: tuple[type, ...]) -> bool:
    """Whether ``exc`` says the credentials are missing or refused (never worth a retry)."""
    if auth and isinstance(exc, auth):
        return True
    for status in (
        getattr(exc, "status_code", None),
        getattr(getattr(exc, "response", None), "status_code", None),
    ):
        if status in _AUTH_STATUS:
            return True
    return bool(_MISSING_KEY.search(str(exc)[:2000]))


def _key_env_var(model: str) -> str:
    """The environment variable litellm reads the key from for ``model``'s provider, or ""."""
    try:
        litellm = _litellm()
        names = litellm.validate_environment(model=model).get("missing_keys") or []
        keys = [name for name in names if name.endswith("_KEY")]
        if keys:
            return keys[0]
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # an unknown provider: say "the provider's API key" instead
        return ""
    return f"{provider.upper()}_API_KEY" if re.fullmatch(r"[a-z0-9_]+", provider or "") else ""


def _auth_error(
    exc: Exception, attempt: int, model: str, secret: str | Iterable[str] | None
) -> LLMAuthenticationError:
    message = scrub_text(str(exc), secret or ())
    env_var = _key_env_var(model)
    where = f"set {env_var} in the environment" if env_var else "set the provider's API key"
    missing = bool(_MISSING_KEY.search(message[:2000]))
    what = "no API key was found" if missing else "the provider refused the API key"
    return LLMAuthenticationError(
        f"LLM call to {model!r} failed: {what} ({type(exc).__name__}: {message[:300]}). "
        f"To fix it, {where} (or pass api_key in the LLM settings) with a valid key that may "
        "use this model; not retried, since a retry cannot fix credentials.",
        model=model,
        attempts=attempt,
        env_var=env_var,
    )


def attempt_timeout(timeout: float | None) -> float | None:
    """An attempt's timeout: ``timeout`` cut to what is left of the current deadline."""
    left = remaining_time()
    if left is None:
        return timeout
    left = max(left, 0.001)
    return left if timeout is None else min(timeout, left)


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


def _error(
    exc: Exception,
    attempt: int,
    model: str,
    secret: str | Iterable[str] | None,
    *,
    timeout: bool = False,
) -> LLMError:
    message = scrub_text(str(exc), secret or ())
    if timeout:
        return LLMTimeout(
            f"LLM call to {model!r} ran out of time after {attempt} attempt(s) (its deadline "
            f"would pass before the next retry); last error: {type(exc).__name__}: "
            f"{message[:500]}",
            model=model,
            attempts=attempt,
        )
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

    ``json_mode`` decides whether calls that want JSON (:meth:`~LLM.complete` with
    ``json_object=True``) send ``response_format={"type": "json_object"}``: False (the default:
    the replies are parsed tolerantly, which measured as well as JSON mode with a 1.5B model,
    docs/benchmarks.md) never, True always, None when litellm lists ``response_format`` among
    the model's parameters. A provider that refuses the parameter gets the call again without
    it, and no JSON mode from this instance after that.
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
        json_mode: bool | None = False,
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
        if json_mode is not None and not isinstance(json_mode, bool):
            raise ValueError("json_mode must be None (decide from the model), True or False")
        self.json_mode = json_mode
        self._json_refused = False

    def json_options(self, messages: Messages) -> dict[str, Any]:
        if self._json_refused or not self._supports_json_mode():
            return {}
        # OpenAI refuses JSON mode unless the messages mention JSON; every prompt of ours that
        # wants JSON says so, and a custom one that does not simply goes without.
        if not any("json" in str(m.get("content") or "").lower() for m in messages):
            return {}
        return {"response_format": {"type": "json_object"}}

    def _supports_json_mode(self) -> bool:
        if self.json_mode is not None:
            return self.json_mode
        return _takes_response_format(self.model_name)

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
        def attempt() -> Any:
            # Each attempt gets at most what is left of the answer's deadline.
            return _litellm().completion(
                **{**kwargs, "timeout": attempt_timeout(kwargs.get("timeout"))}
            )

        return call_with_retries(
            attempt,
            model=self.model_name,
            max_retries=self.max_retries,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            secret=self._secrets(),
        )

    def _secrets(self) -> list[str]:
        """What error messages must never show: the key, URL credentials, secret headers."""
        return secrets_in({"api_key": self._api_key}, self.api_base, self.extra)

    def _error(self, exc: Exception, attempt: int) -> LLMError:
        return _error(exc, attempt, self.model_name, self._secrets())

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
        try:
            response = self._call(self._kwargs(messages, options))
        except LLMError as exc:
            if not _json_mode_refused(exc, options):
                raise
            logger.warning(
                "LLM %s refused JSON mode (response_format); calling again without it",
                self.model_name,
            )
            self._json_refused = True
            options = {k: v for k, v in options.items() if k != "response_format"}
            response = self._call(self._kwargs(messages, options))
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        text = getattr(message, "content", None) if message is not None else None
        if not isinstance(text, str) or not text.strip():
            # No choices (a filtered or broken reply) or no text in the first one: a typed
            # error, so callers take their fallbacks instead of failing on an IndexError.
            finish = getattr(choices[0], "finish_reason", None) if choices else None
            raise LLMResponseError(
                f"The LLM {self.model_name!r} returned "
                + ("no choices" if not choices else f"no text (finish reason {finish!r})")
                + "; try again, or check the provider's content filters and the max_tokens option.",
                model=self.model_name,
            )
        return Completion(
            text,
            self._usage(getattr(response, "usage", None)),
            self.model_name,
            finish_reason=getattr(choices[0], "finish_reason", None),
        )

    def _chat(
        self, messages: Messages, tools: list[dict[str, Any]], **options: Any
    ) -> ToolCompletion:
        """Native tool calling: OpenAI-style ``tools`` (litellm translates them for other
        providers); the reply's ``tool_calls`` become :class:`ToolCall` objects."""
        kwargs = self._kwargs(messages, options)
        if tools:
            kwargs["tools"] = tools
            kwargs.setdefault("tool_choice", "auto")
            if _mcp_missing():
                kwargs["_skip_mcp_handler"] = True
        response = self._call(kwargs)
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise LLMResponseError(
                f"The LLM {self.model_name!r} returned no choices; try again, or check the "
                "provider's content filters.",
                model=self.model_name,
            )
        message = getattr(choices[0], "message", None)
        text = getattr(message, "content", None) if message is not None else None
        calls = []
        for index, raw in enumerate(getattr(message, "tool_calls", None) or []):
            function = _field(raw, "function")
            calls.append(
                ToolCall.parse(
                    _field(raw, "id") or f"call_{index}",
                    _field(function, "name") or "",
                    _field(function, "arguments"),
                )
            )
        text = text if isinstance(text, str) else ""
        finish = getattr(choices[0], "finish_reason", None)
        if tools and not calls:
            # A model that wrote its call as text (a small local one, or a server that does
            # not parse its tool format) still gets its call made.
            calls = tool_calls_in_text(text, tools, id_prefix=f"call_{len(messages)}")
            if calls:
                text, finish = "", "tool_calls"
        return ToolCompletion(
            text,
            self._usage(getattr(response, "usage", None)),
            self.model_name,
            tool_calls=calls,
            finish_reason=finish,
        )

    def _stream(self, messages: Messages, **options: Any) -> Iterator[str | Usage]:
        kwargs = self._kwargs(messages, options)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        usage = None
        finish = None
        received: list[str] = []
        try:
            response = self._call(kwargs)
            for chunk in response:
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
                choices = getattr(chunk, "choices", None) or []
                if choices and getattr(choices[0], "finish_reason", None):
                    finish = choices[0].finish_reason
                delta = getattr(choices[0], "delta", None) if choices else None
                content = getattr(delta, "content", None) if delta is not None else None
                if content:
                    received.append(content)
                    yield content
        except LLMError:
            raise
        except Exception as exc:  # the connection broke (or timed out) mid-stream
            raise self._stream_error(exc, "".join(received)) from None
        if not _finished(response, finish):
            raise LLMStreamError(
                f"The LLM {self.model_name!r} stream ended before the model finished (no "
                f"finish reason after {len(''.join(received))} characters; the connection "
                "probably dropped). The answer is incomplete: ask again.",
                model=self.model_name,
                partial="".join(received),
            )
        yield self._usage(usage)

    def _stream_error(self, exc: Exception, partial: str) -> LLMError:
        message = scrub_text(str(exc), self._secrets())[:500]
        left = remaining_time()
        if left is not None and left <= 0:
            return LLMTimeout(
                f"The LLM {self.model_name!r} stream passed its deadline after {len(partial)} "
                f"characters ({type(exc).__name__}: {message}); the answer is incomplete.",
                model=self.model_name,
            )
        return LLMStreamError(
            f"The LLM {self.model_name!r} stream broke after {len(partial)} characters: "
            f"{type(exc).__name__}: {message}. The answer is incomplete: ask again.",
            model=self.model_name,
            partial=partial,
        )

    def __repr__(self) -> str:
        api_base = scrub_text(self.api_base, self._secrets()) if self.api_base else None
        return f"<LiteLLM model={self.model_name!r} api_base={api_base!r}>"


@functools.cache
@functools.lru_cache(maxsize=128)
def _takes_response_format(model: str) -> bool:
    """Whether litellm lists ``response_format`` among ``model``'s parameters."""
    try:
        params = _litellm().get_supported_openai_params(model=model) or []
    except Exception:  # an unknown model or provider: no JSON mode
        return False
    return "response_format" in params


def _json_mode_refused(exc: LLMError, options: dict[str, Any]) -> bool:
    """Whether a call that sent ``response_format`` failed at once because the provider
    does not take it (a bad request, not a transient or credential failure)."""
    if "response_format" not in options or isinstance(exc, LLMTimeout | LLMAuthenticationError):
        return False
    message = str(exc)
    return (
        exc.attempts == 1
        and any(name in message for name in ("BadRequestError", "UnsupportedParamsError"))
        and any(word in message.lower() for word in ("response_format", "json"))
    )


def _mcp_missing() -> bool:
    """Whether litellm's MCP bridge cannot load. litellm (1.106) imports it for every call
    with ``tools``, and it needs the ``mcp`` package, which only its proxy extra installs; the
    bridge is for MCP tools, which we never send, so we tell litellm to skip it then."""
    try:
        import litellm.responses.mcp.chat_completions_handler  # noqa: F401
    except ImportError as exc:
        return (exc.name or "").split(".")[0] == "mcp"
    return False


def _field(value: Any, name: str) -> Any:
    """``value.name`` or ``value[name]``: litellm gives objects, some providers plain dicts."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _finished(response: Any, finish: str | None) -> bool:
    """Whether the provider ended the stream normally. litellm makes up a "stop" finish
    reason when a stream just ends (a dropped connection looks like the end of the body),
    so its wrapper's record of the finish reason the provider really sent is what counts."""
    if hasattr(response, "received_finish_reason"):
        return bool(
            getattr(response, "received_finish_reason", None)
            or getattr(response, "intermittent_finish_reason", None)
        )
    return finish is not None

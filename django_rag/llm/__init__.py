"""The LLM layer: a base class, litellm and callable backends, usage and JSON parsing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..conf import build_component, get_setting, redact
from ..exceptions import ConfigurationError, InvalidOption, LLMNotConfigured
from .base import (
    LLM,
    Completion,
    TextStream,
    ToolCall,
    ToolCompletion,
    Usage,
    UsageMeter,
    collect_usage,
    deadline,
    estimate_tokens,
    map_concurrently,
    remaining_time,
    tool_message,
    tool_schema,
)
from .callable import CallableLLM
from .errors import AgentTimeout, LLMAuthenticationError, LLMStreamError, LLMTimeout
from .litellm import LiteLLM
from .parsing import as_bool, json_flag, parse_json

ALIASES = {
    "litellm": "django_rag.llm.litellm.LiteLLM",
    "scripted": "django_rag.llm.scripted.ScriptedLLM",
}

_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def get_llm(spec: Any = None, *, feature: str = "This operation", setting: str = "LLM") -> LLM:
    """Build an :class:`LLM` from ``spec``, or from ``DJANGO_RAG["LLM"]`` when it is None.

    ``spec`` may be a litellm model string, ``{"model": ..., **options}``, a
    ``(model, options)`` pair, ``{"BACKEND": ..., "OPTIONS": ...}``, an alias, a dotted path,
    a function (``prompt``, ``(prompt, context)`` or ``(prompt, context, opts)``, see
    :class:`CallableLLM`) returning text, or an :class:`LLM` instance.
    """
    from_setting = spec is None
    if spec is None:
        spec = get_setting("LLM")
        if spec is None:
            raise LLMNotConfigured(feature)
    if isinstance(spec, LLM):
        return spec
    if isinstance(spec, tuple | list) and len(spec) == 2 and isinstance(spec[0], str):
        spec = {"model": spec[0], **dict(spec[1] or {})}
    model = spec.get("model") if isinstance(spec, Mapping) and "BACKEND" not in spec else spec
    if isinstance(model, str) and not model.strip():
        if from_setting:
            raise ConfigurationError(setting, spec, "the model string is empty")
        raise InvalidOption(
            f"{feature} got an empty model string; give a litellm model such as "
            "'openai/gpt-4o-mini', or None for DJANGO_RAG['LLM']."
        )
    if isinstance(spec, Mapping) and "BACKEND" not in spec:
        if "model" not in spec:
            raise ConfigurationError(
                setting, redact(spec), "a dict needs 'model' (a litellm model string) or 'BACKEND'"
            )
        spec = {"BACKEND": "litellm", "OPTIONS": dict(spec)}
    if isinstance(spec, str) and spec not in ALIASES and not _DOTTED_PATH.match(spec):
        spec = {"BACKEND": "litellm", "OPTIONS": {"model": spec}}
    try:
        return build_component(
            spec, setting=setting, base=LLM, aliases=ALIASES, wrap_callable=CallableLLM
        )
    except InvalidOption as exc:  # a function whose signature fits no call
        if from_setting:
            raise ConfigurationError(setting, redact(spec), str(exc)) from exc
        raise


__all__ = [
    "LLM",
    "AgentTimeout",
    "CallableLLM",
    "Completion",
    "LLMAuthenticationError",
    "LLMStreamError",
    "LLMTimeout",
    "LiteLLM",
    "TextStream",
    "ToolCall",
    "ToolCompletion",
    "tool_message",
    "tool_schema",
    "deadline",
    "remaining_time",
    "as_bool",
    "json_flag",
    "Usage",
    "UsageMeter",
    "collect_usage",
    "estimate_tokens",
    "get_llm",
    "map_concurrently",
    "parse_json",
]

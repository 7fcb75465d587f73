"""The base of LLM-backed components (query rewriters, agent steps...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..exceptions import LLMResponseError
from . import get_llm


class Component:
    """Base of the LLM-backed components: holds the ``llm`` and ``prompt`` they use."""

    default_prompt: Callable[..., str] | None = None

    def __init__(self, *, llm: Any = None, prompt: Callable[..., Any] | None = None):
        self.llm = llm
        self.prompt = prompt or type(self).default_prompt

    def complete(self, prompt: str, *, system: str | None = None) -> str:
        return self._llm().complete(prompt, system=system).text.strip()

    def complete_json(self, prompt: str, *, expect: type | None = dict) -> Any:
        """The JSON value of the reply (see :meth:`~django_rag.llm.LLM.complete_json`)."""
        return self._llm().complete_json(prompt, expect=expect)

    def _llm(self):
        return get_llm(self.llm, feature=f"The {type(self).__name__}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def one_line(text: str, what: str) -> str:
    line = text.strip().strip("`").strip().splitlines()[0].strip().strip('"') if text else ""
    if not line:
        raise LLMResponseError(f"The LLM returned an empty {what}.")
    return line

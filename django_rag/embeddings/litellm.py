"""Embeddings from any API model through litellm."""

from __future__ import annotations

from collections.abc import Sequence

from ..llm.litellm import call_with_retries, import_litellm
from .base import Embedder


class LiteLLMEmbedder(Embedder):
    """Embeds through ``litellm.embedding`` (OpenAI, Cohere, Voyage, Ollama, ...).

    ``api_key`` is passed to litellm and never shown in ``repr`` or errors. Rate limits and
    other transient failures are retried like the LLM backend's (``max_retries``, ``backoff``).
    """

    def __init__(
        self,
        *,
        model: str = "openai/text-embedding-3-small",
        dimensions: int | None = None,
        api_key: str | None = None,
        api_base: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        batch_size: int = 64,
        query_prefix: str = "",
        document_prefix: str = "",
        extra: dict | None = None,
    ):
        self.model_name = model
        self._dimensions = dimensions
        self._api_key = api_key
        self.api_base = api_base
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.extra = dict(extra or {})

    def _embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        litellm = import_litellm("The litellm embedder")

        kwargs = dict(self.extra)
        if self._api_key:
            kwargs["api_key"] = self._api_key
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self._dimensions and self.model_name.split("/")[-1].startswith("text-embedding-3"):
            kwargs["dimensions"] = self._dimensions
        response = call_with_retries(
            lambda: litellm.embedding(
                model=self.model_name, input=texts, timeout=self.timeout, max_retries=0, **kwargs
            ),
            model=self.model_name,
            max_retries=self.max_retries,
            backoff=self.backoff,
            max_backoff=30.0,
            secret=self._api_key,
        )
        items = sorted(response.data, key=lambda item: _get(item, "index"))
        return [_get(item, "embedding") for item in items]


def _get(item, key):
    return item[key] if isinstance(item, dict) else getattr(item, key)

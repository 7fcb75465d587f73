"""Embedders: the base class, the built-ins and the configured default."""

from __future__ import annotations

from typing import Any

from ..conf import build_component, get_setting, on_reset
from .base import Embedder
from .callable import CallableEmbedder
from .litellm import LiteLLMEmbedder
from .sentence_transformers import SentenceTransformerEmbedder

ALIASES = {
    "sentence-transformers": "django_rag.embeddings.sentence_transformers.SentenceTransformerEmbedder",
    "local": "django_rag.embeddings.sentence_transformers.SentenceTransformerEmbedder",
    "litellm": "django_rag.embeddings.litellm.LiteLLMEmbedder",
    "hashing": "django_rag.testing.HashingEmbedder",
}

_default: list[Embedder] = []


def get_embedder(spec: Any = None) -> Embedder:
    """Return the embedder for ``spec``, or the configured one (built once) when it is None."""
    if spec is not None:
        return build_component(
            spec, setting="EMBEDDER", base=Embedder, aliases=ALIASES, wrap_callable=CallableEmbedder
        )
    if not _default:
        _default.append(get_embedder(get_setting("EMBEDDER")))
    return _default[0]


on_reset(_default.clear)

__all__ = [
    "Embedder",
    "CallableEmbedder",
    "LiteLLMEmbedder",
    "SentenceTransformerEmbedder",
    "get_embedder",
]

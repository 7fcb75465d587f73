"""Embedders: the base class, the built-ins and the configured default."""

from __future__ import annotations

import time
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
    "hashing": "django_rag.embeddings.hashing.HashingEmbedder",
}

_default: dict[str, Embedder] = {}
_switched: dict[tuple[str, str | None], tuple[float, bool]] = {}
# How long a process trusts its answer to "has the switch to NEXT_EMBEDDER completed?".
SWITCH_CHECK_SECONDS = 2.0


def build_embedder(spec: Any, setting: str = "EMBEDDER") -> Embedder:
    return build_component(
        spec, setting=setting, base=Embedder, aliases=ALIASES, wrap_callable=CallableEmbedder
    )


def configured_embedder(setting: str = "EMBEDDER") -> Embedder | None:
    """The embedder of ``EMBEDDER`` or ``NEXT_EMBEDDER`` (built once), None when unset."""
    if setting not in _default:
        spec = get_setting(setting)
        if spec is None:
            return None
        _default[setting] = build_embedder(spec, setting)
    return _default[setting]


def switch_completed(model_name: str, *, using: str | None = None) -> bool:
    """Whether the chunks' vectors were switched to ``model_name`` (checked every 2 s), as the
    database ``using`` (a search's replica; None: the routers' choice) records it: the job row
    is completed in the transaction that swaps the column, so both replicate together."""
    now = time.monotonic()
    cached = _switched.get((model_name, using))
    if cached is None or now - cached[0] > SWITCH_CHECK_SECONDS:
        from ..models import Job

        done = (
            Job.objects.using(using)
            .filter(kind=Job.Kind.SWITCH, status=Job.Status.COMPLETED, params__model=model_name)
            .exists()
        )
        cached = _switched[(model_name, using)] = (now, done)
    return cached[1]


def forget_switch(model_name: str) -> None:
    """Drop every database's cached answer of :func:`switch_completed` for ``model_name``
    (the model switch calls it once it has swapped the column)."""
    for key in [key for key in _switched if key[0] == model_name]:
        _switched.pop(key, None)


def get_embedder(spec: Any = None, *, using: str | None = None) -> Embedder:
    """Return the embedder for ``spec``, or the active one when it is None.

    The active embedder is ``EMBEDDER``, or ``NEXT_EMBEDDER`` once ``rag_reembed`` has switched
    the stored vectors to it (so every process moves to the new model at the swap), as the
    database ``using`` records it (searches pass theirs).
    """
    if spec is not None:
        return build_embedder(spec)
    upcoming = configured_embedder("NEXT_EMBEDDER")
    if upcoming is not None and switch_completed(upcoming.model_name, using=using):
        return upcoming
    return configured_embedder("EMBEDDER")


def active_dimensions(*, using: str | None = None) -> int:
    """Size of the stored vectors: ``EMBEDDING_DIMENSIONS``, or the next embedder's once the
    switch to it has completed (until the setting is updated to match) in the database
    ``using`` (None: the routers' choice)."""
    from ..conf import embedding_dimensions

    upcoming = configured_embedder("NEXT_EMBEDDER")
    if upcoming is not None and switch_completed(upcoming.model_name, using=using):
        return upcoming.dimensions
    return embedding_dimensions()


def _reset() -> None:
    _default.clear()
    _switched.clear()


on_reset(_reset)

__all__ = [
    "active_dimensions",
    "configured_embedder",
    "Embedder",
    "CallableEmbedder",
    "LiteLLMEmbedder",
    "SentenceTransformerEmbedder",
    "get_embedder",
]

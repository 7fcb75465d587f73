"""Rerankers: reorder search results by a stronger relevance model.

Any of them can be passed as ``search(..., reranker=...)``, set as ``DJANGO_RAG["RERANKER"]``
or used in the agent's ``rerank`` step.
"""

from __future__ import annotations

from typing import Any

from ..conf import build_component, get_setting
from .base import CallableReranker, Reranker, dedupe
from .colbert import ColBERTReranker
from .cross_encoder import CrossEncoderReranker
from .llm import LLMReranker

ALIASES = {
    "llm": "django_rag.rerankers.llm.LLMReranker",
    "cross-encoder": "django_rag.rerankers.cross_encoder.CrossEncoderReranker",
    "colbert": "django_rag.rerankers.colbert.ColBERTReranker",
}


def get_reranker(spec: Any = None) -> Reranker | None:
    """Build a reranker from ``spec`` (or ``DJANGO_RAG["RERANKER"]``); None means no reranking."""
    if spec is None:
        spec = get_setting("RERANKER")
    if spec is None or spec is False:
        return None
    return build_component(
        spec, setting="RERANKER", base=Reranker, aliases=ALIASES, wrap_callable=CallableReranker
    )


__all__ = [
    "CallableReranker",
    "ColBERTReranker",
    "CrossEncoderReranker",
    "LLMReranker",
    "Reranker",
    "dedupe",
    "get_reranker",
]

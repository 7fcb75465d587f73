"""The search service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..conf import search_setting
from ..embeddings import get_embedder
from ..exceptions import InvalidOption, InvalidSearchMode
from .results import SearchResult
from .stores import get_vector_store

MODES = ("semantic",)
MODE_ALIASES = {"vector": "semantic"}
MAX_LIMIT = 1000


def normalize_mode(mode: str | None) -> str:
    mode = search_setting("MODE") if mode is None else mode
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        raise InvalidSearchMode(
            f"Unknown search mode {mode!r}. Available modes: {', '.join(MODES)} "
            f"(aliases: {', '.join(MODE_ALIASES)}).",
            mode=mode,
        )
    return mode


def normalize_collections(collection: Any) -> list[str] | None:
    if collection is None:
        return None
    names = [collection] if isinstance(collection, str) else list(collection)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidOption(f"collection names must be non-empty strings, got {name!r}")
    return names


def search(
    query: str,
    *,
    mode: str | None = None,
    limit: int | None = None,
    threshold: float | None = None,
    collection: str | Sequence[str] | None = None,
    source_id: str | None = None,
    embedder=None,
    vector_store=None,
) -> list[SearchResult]:
    """Search the stored chunks and return the best ``limit`` as :class:`SearchResult`.

    ``collection`` is a name or a list of names (None searches every collection; an unknown
    name raises :class:`~django_rag.exceptions.UnknownCollection`). In ``semantic`` mode
    ``threshold`` is a minimum cosine similarity (-1..1); results have ``score >= threshold``.
    """
    mode = normalize_mode(mode)
    limit = search_setting("LIMIT") if limit is None else limit
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidOption(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if threshold is not None and not isinstance(threshold, int | float):
        raise InvalidOption(f"threshold must be a number, got {threshold!r}")
    if not isinstance(query, str):
        raise InvalidOption(f"query must be a string, got {type(query).__name__}")
    collections = normalize_collections(collection)
    query = query.replace("\x00", "")
    if not query.strip():
        return []
    store = get_vector_store(vector_store)
    vector = get_embedder(embedder).embed_query(query)
    return store.search(
        vector, limit=limit, threshold=threshold, collections=collections, source_id=source_id
    )

"""The ``DJANGO_RAG`` settings dict, its defaults, and component resolution.

Settings are read through :func:`get_settings`, which caches the merged dict and is reset when
Django's ``setting_changed`` signal fires (``override_settings`` in tests). Nothing reads
settings at import time.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ConfigurationError

SETTING_NAME = "DJANGO_RAG"

DEFAULTS: dict[str, Any] = {
    # Embedder: an alias ("sentence-transformers", "litellm", "hashing"), a dotted path to a class,
    # callable or instance, or {"BACKEND": <alias or path>, "OPTIONS": {...}}.
    "EMBEDDER": {
        "BACKEND": "sentence-transformers",
        "OPTIONS": {"model": "all-MiniLM-L6-v2"},
    },
    # Size of the chunk embedding column. Must equal the embedder's output size.
    "EMBEDDING_DIMENSIONS": 384,
    # The embedder to switch to without downtime (same forms as EMBEDDER): `rag_reembed`
    # fills a shadow column with its vectors and swaps it in; from then on it is used.
    "NEXT_EMBEDDER": None,
    # Chunker: same forms as EMBEDDER; "token" is the built-in token-aware splitter.
    "CHUNKER": {"BACKEND": "token", "OPTIONS": {}},
    # Parsers by file extension, merged over the built-ins; a value of None disables one.
    "PARSERS": {},
    # Where search runs: "pgvector" (default) or "memory", or a dotted path / instance.
    "VECTOR_STORE": "pgvector",
    "DEFAULT_COLLECTION": "default",
    # Longest document text accepted by ingest, in characters.
    "MAX_DOCUMENT_CHARS": 10_000_000,
    # Parser budgets, enforced while a file is read so hostile files are refused early
    # (None disables one): pages of a PDF, bytes of drawing instructions on one PDF page
    # (content streams, forms per call, annotation appearances), seconds spent reading a PDF.
    "MAX_PDF_PAGES": 2_000,
    "MAX_PDF_PAGE_CONTENT_BYTES": 16 * 1024 * 1024,
    "PARSE_TIMEOUT": 60,
    # PostgreSQL text search configuration used for the chunks' search vectors.
    "TEXT_SEARCH_CONFIG": "english",
    "SEARCH": {
        "MODE": "semantic",
        "LIMIT": 10,
        # A filtered search whose filter matches at most this many chunks is answered by an
        # exact scan (always complete); larger filtered sets use the HNSW index and fall back
        # to an exact scan when the index returns too few rows.
        "EXACT_SEARCH_MAX_ROWS": 5_000,
        # HNSW candidate list size; raised automatically to the requested limit.
        "HNSW_EF_SEARCH": 200,
        # BM25 parameters of full-text mode.
        "BM25_K1": 1.2,
        "BM25_B": 0.75,
        # Hybrid mode: "weighted" or "rrf" fusion over the top CANDIDATES x limit chunks of each
        # side (both scores are then computed for every candidate). Defaults chosen on the
        # SciFact train queries (docs/benchmarks.md).
        "FUSION": "weighted",
        "RRF_K": 60,
        "SEMANTIC_WEIGHT": 0.6,
        "FULLTEXT_WEIGHT": 0.4,
        "CANDIDATES": 2,
        # With a reranker, search fetches RERANK_CANDIDATES x limit chunks and reranks them.
        "RERANK_CANDIDATES": 3,
    },
    # Default LLM for ask(), the agent and evaluation: a litellm model string
    # ("openai/gpt-4o-mini"), {"model": ..., **options}, {"BACKEND": ..., "OPTIONS": {...}},
    # a dotted path, a callable taking the prompt and returning text, or an LLM instance.
    "LLM": None,
    # Reranker applied by search() when none is given per call (None: no reranking).
    "RERANKER": None,
    # GraphRAG (docs/graphrag.md). Off by default; per call: ingest(..., graph=True).
    "GRAPH": {
        "ENABLED": False,
        # A combined extractor (entities and relationships in one call per chunk), or None to
        # use ENTITY_EXTRACTOR + RELATIONSHIP_EXTRACTOR. Aliases: "llm", "ner", "capitalized",
        # "cooccurrence"; or dotted paths, classes, instances, functions.
        "EXTRACTOR": "llm",
        "ENTITY_EXTRACTOR": "ner",
        "RELATIONSHIP_EXTRACTOR": "cooccurrence",
        "CONCURRENCY": 3,
        # Query time: entity matching, expansion over relationships, fusion.
        "ENTITY_MATCHER": "embedding",
        "MATCH_THRESHOLD": 0.3,
        "MATCH_LIMIT": 20,
        "DEPTH": 0,
        "DEPTH_DECAY": 0.5,
        "RRF_K": 60,
        # Communities (hierarchical Leiden) and their summaries.
        "RESOLUTION": 1.0,
        "LEVELS": 1,
        "MAX_CLUSTER_SIZE": 50,
        "MIN_SIZE": 2,
        "SEED": 42,
        "SUMMARY_THRESHOLD": 10,
        "SUMMARY_CONCURRENCY": 4,
        "SUMMARY_LEVELS": [0],
        # What ask(..., graph=True) adds to the prompt.
        "CONTEXT_ENTITIES": 10,
        "CONTEXT_RELATIONSHIPS": 20,
        "CONTEXT_SUMMARIES": 5,
    },
    # The dashboard (django_rag.dashboard.urls): who may use it, which collections each user
    # sees (a dotted path or callable: user -> list of names, or None for all), upload limit.
    "DASHBOARD": {
        "PERMISSION": None,  # None: staff users; else a callable (user) -> bool
        "COLLECTIONS": None,
        "MAX_UPLOAD_BYTES": 10 * 1024 * 1024,
        "PAGE_SIZE": 20,
    },
    # Where background work runs: "auto" (Celery when a broker is configured, else inline),
    # "celery" or "inline".
    "BACKGROUND": "auto",
    "TELEMETRY": {
        # Put raw document, query and answer text in telemetry metadata.
        "INCLUDE_TEXT": False,
        # Attach the logging receiver at this level ("INFO", "DEBUG"...) at start-up.
        "LOG_LEVEL": None,
        # Count Prometheus metrics (when prometheus_client is installed).
        "PROMETHEUS": True,
        # Emit OpenTelemetry spans (needs opentelemetry-api).
        "OPENTELEMETRY": False,
    },
}

_NESTED = ("SEARCH", "TELEMETRY", "GRAPH", "DASHBOARD")


@functools.cache
def get_settings() -> dict[str, Any]:
    """Return the effective settings: ``DJANGO_RAG`` merged over :data:`DEFAULTS`."""
    user = getattr(django_settings, SETTING_NAME, {}) or {}
    if not isinstance(user, Mapping):
        raise ConfigurationError("*", user, "DJANGO_RAG must be a dict")
    unknown = set(user) - set(DEFAULTS)
    if unknown:
        raise ConfigurationError(
            sorted(unknown)[0],
            user[sorted(unknown)[0]],
            f"unknown setting; known settings are {', '.join(sorted(DEFAULTS))}",
        )
    merged = copy.deepcopy(DEFAULTS)
    for key, value in user.items():
        if key in _NESTED and isinstance(value, Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def get_setting(name: str) -> Any:
    return get_settings()[name]


def search_setting(name: str) -> Any:
    return get_settings()["SEARCH"][name]


def graph_setting(name: str) -> Any:
    return get_settings()["GRAPH"][name]


def embedding_dimensions() -> int:
    dims = get_setting("EMBEDDING_DIMENSIONS")
    if not isinstance(dims, int) or isinstance(dims, bool) or dims <= 0 or dims > 16000:
        raise ConfigurationError(
            "EMBEDDING_DIMENSIONS", dims, "must be a positive integer (pgvector allows up to 16000)"
        )
    return dims


_reset_callbacks: list[Callable[[], None]] = []


def on_reset(func: Callable[[], None]) -> Callable[[], None]:
    """Register ``func`` to run when ``DJANGO_RAG`` changes (for caches of built components)."""
    _reset_callbacks.append(func)
    return func


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs) -> None:
    if setting == SETTING_NAME:
        get_settings.cache_clear()
        for callback in _reset_callbacks:
            callback()


_SECRET_KEY = re.compile(
    r"secret|password|passwd|(^|_)(api_?key|access_?key|private_?key|token|credentials?|auth|"
    r"authorization)$",
    re.IGNORECASE,
)
REDACTED = "[REDACTED]"


def is_secret_key(key: Any) -> bool:
    """True for option names that hold secrets (api_key, password, hf_token, ...)."""
    return bool(_SECRET_KEY.search(str(key)))


def redact(value: Any) -> Any:
    """Return ``value`` with every secret-looking entry of nested dicts replaced by a marker."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_secret_key(key) and item else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(item) for item in value)
    return value


# --- component resolution ---------------------------------------------------------------------


def import_string(path: str, *, setting: str) -> Any:
    module_path, _, attr = path.rpartition(".")
    if not module_path:
        raise ConfigurationError(
            setting, path, "expected a dotted path such as 'myapp.rag.MyClass'"
        )
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigurationError(setting, path, f"cannot import {module_path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(
            setting, path, f"{module_path!r} has no attribute {attr!r}"
        ) from exc


def build_component(
    spec: Any,
    *,
    setting: str,
    base: type,
    aliases: Mapping[str, str],
    wrap_callable: Callable[[Callable], Any] | None = None,
) -> Any:
    """Turn a component spec into an instance of ``base``.

    ``spec`` may be an instance, a class, an alias, a dotted path (to a class, an instance or a
    callable), a ``{"BACKEND": ..., "OPTIONS": {...}}`` dict, or a plain callable (wrapped by
    ``wrap_callable``). Anything else raises :class:`ConfigurationError` naming ``setting``.
    """
    options: dict[str, Any] = {}
    original = spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"BACKEND", "OPTIONS"}
        if "BACKEND" not in spec or unknown:
            raise ConfigurationError(
                setting, original, "a dict needs a 'BACKEND' key and optionally 'OPTIONS'"
            )
        options = dict(spec.get("OPTIONS") or {})
        spec = spec["BACKEND"]
    if isinstance(spec, str):
        spec = import_string(aliases.get(spec, spec), setting=setting)
    if isinstance(spec, base):
        if options:
            raise ConfigurationError(setting, original, "OPTIONS cannot be applied to an instance")
        return spec
    if inspect.isclass(spec):
        if not issubclass(spec, base):
            raise ConfigurationError(
                setting, original, f"{spec.__qualname__} is not a subclass of {base.__qualname__}"
            )
        try:
            return spec(**options)
        except TypeError as exc:
            raise ConfigurationError(setting, original, f"bad OPTIONS: {exc}") from exc
    if callable(spec) and wrap_callable is not None:
        return wrap_callable(spec, **options)
    raise ConfigurationError(
        setting,
        original,
        f"expected an alias ({', '.join(sorted(aliases))}), a dotted path, a {base.__qualname__} "
        "subclass or instance, or a callable",
    )

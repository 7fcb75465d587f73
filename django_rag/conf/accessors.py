"""The ``DJANGO_RAG`` settings dict, its defaults, and the accessors every layer reads it with.

Settings are read through :func:`get_settings`, which caches the merged dict and is reset when
Django's ``setting_changed`` signal fires (``override_settings`` in tests). Nothing reads
settings at import time.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .. import settings_schema
from ..exceptions import ConfigurationError

SETTING_NAME = "DJANGO_RAG"

# Every key's default, built from the schema (django_rag.settings_schema declares each key once:
# its type or accepted values, its default, what it does).
DEFAULTS: dict[str, Any] = settings_schema.defaults()

_NESTED = tuple(setting.name for setting in settings_schema.SCHEMA if setting.is_section)


@functools.cache
def get_settings() -> dict[str, Any]:
    """Return the effective settings: ``DJANGO_RAG`` merged over :data:`DEFAULTS`.

    An unknown key, top-level or in a section (``SEARCH``, ``GRAPH``...), raises
    :class:`~django_rag.exceptions.UnknownSetting` naming it and the closest known key. Types
    are checked when a value is read (:func:`get_setting`, :func:`search_setting`...) and all
    at once by :func:`validate_settings` (system check E005).
    """
    user = getattr(django_settings, SETTING_NAME, {}) or {}
    if not isinstance(user, Mapping):
        raise ConfigurationError("*", user, "DJANGO_RAG must be a dict")
    settings_schema.check_known(user)
    merged = copy.deepcopy(DEFAULTS)
    for key, value in user.items():
        if key in _NESTED:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def validate_settings() -> list[ConfigurationError]:
    """Every problem of ``DJANGO_RAG`` the schema finds: the first unknown key (with the
    closest known one), else each value of a wrong type or outside its accepted values."""
    try:
        settings = get_settings()
    except ConfigurationError as exc:
        return [exc]
    return settings_schema.problems(settings)


def _checked(path: str, value: Any) -> Any:
    settings_schema.lookup(path).check(value, path)
    return value


def get_setting(name: str) -> Any:
    """The effective value of ``DJANGO_RAG[name]``; a value of a wrong type raises
    :class:`ConfigurationError` naming the setting (a section is returned as its dict)."""
    return _checked(name, get_settings()[name])


def section_setting(section: str, name: str) -> Any:
    """The effective value of ``DJANGO_RAG[section][name]``, type-checked."""
    return _checked(f"{section}.{name}", get_settings()[section][name])


def call_defaults(section: str, **given: Any) -> dict[str, Any]:
    """``given`` (a call's options) with each one left None replaced by its project-wide
    default, ``DJANGO_RAG[section][NAME]`` (``ASK``, ``LOOP``): a value given in the call
    wins, as Arcana merges its ``ask:``/``loop:`` config under the call's options."""
    return {
        name: section_setting(section, name.upper()) if value is None else value
        for name, value in given.items()
    }


def search_setting(name: str) -> Any:
    return section_setting("SEARCH", name)


def graph_setting(name: str) -> Any:
    return section_setting("GRAPH", name)


# GRAPH numbers read when a search fuses the graph list: (minimum, maximum or None).
_GRAPH_NUMBERS = {
    "WEIGHT": (0.0, None),
    "MIN_MATCH_SCORE": (0.0, 1.0),
    "RRF_K": (0.0, None),
}


def graph_number(name: str) -> float:
    """A numeric ``GRAPH`` setting of the graph fusion, checked against its bounds: a bad value
    raises :class:`ConfigurationError` (system check E005 reports it at startup)."""
    value = graph_setting(name)
    low, high = _GRAPH_NUMBERS[name]
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = None
    if (
        number is None
        or not math.isfinite(number)
        or number < low
        or (high is not None and number > high)
    ):
        bounds = f"from {low:g} to {high:g}" if high is not None else f">= {low:g}"
        raise ConfigurationError(f"GRAPH.{name}", value, f"must be a finite number {bounds}")
    return number


FULLTEXT_BACKENDS = settings_schema.lookup("SEARCH.FULLTEXT_BACKEND").choices


def fulltext_backend_setting() -> str:
    """``SEARCH["FULLTEXT_BACKEND"]``, checked: a bad value raises :class:`ConfigurationError`
    (system check E005 reports it at startup)."""
    value = search_setting("FULLTEXT_BACKEND")
    if not isinstance(value, str) or value not in FULLTEXT_BACKENDS:
        raise ConfigurationError(
            "SEARCH.FULLTEXT_BACKEND",
            value,
            f"must be one of {', '.join(repr(b) for b in FULLTEXT_BACKENDS)} (docs/search.md, "
            "'Full-text backends')",
        )
    return value


def max_query_terms() -> int | None:
    """``SEARCH["MAX_QUERY_TERMS"]``, checked: a positive integer or None (no cap); anything
    else raises :class:`ConfigurationError` (system check E005 reports it at startup)."""
    value = search_setting("MAX_QUERY_TERMS")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            "SEARCH.MAX_QUERY_TERMS",
            value,
            "must be a positive integer (the most distinct words one full-text query scores "
            "with) or None for no cap (docs/search.md, 'Cost budget')",
        )
    return value


def _finite_number(value) -> float | None:
    """``value`` as a finite float when it is an int or float (not a bool), else None."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) else None


def bm25_k3() -> float | None:
    """``SEARCH["BM25_K3"]``, checked: a finite number >= 0 (how fast the weight of a word
    repeated in a full-text query saturates; 0: counted once) or None (its raw count); anything
    else raises :class:`ConfigurationError` (system check E005 reports it at startup)."""
    value = search_setting("BM25_K3")
    if value is None:
        return None
    number = _finite_number(value)
    if number is None or number < 0:
        raise ConfigurationError(
            "SEARCH.BM25_K3",
            value,
            "must be a finite number >= 0 (0: a word repeated in a query counts once) or None "
            "(each word weighs its count) (docs/search.md, 'Repeated query words')",
        )
    return number


def statement_timeout() -> float | None:
    """``SEARCH["STATEMENT_TIMEOUT"]`` in seconds, checked: a positive finite number or None
    (no limit); anything else raises :class:`ConfigurationError` (system check E005)."""
    value = search_setting("STATEMENT_TIMEOUT")
    if value is None:
        return None
    number = _finite_number(value)
    if number is None or number <= 0:
        raise ConfigurationError(
            "SEARCH.STATEMENT_TIMEOUT",
            value,
            "must be a positive number of seconds or None for no limit (docs/search.md, "
            "'Cost budget')",
        )
    return number


def check_search_budget() -> None:
    """Raise :class:`ConfigurationError` for an invalid search cost budget setting."""
    max_query_terms()
    statement_timeout()
    bm25_k3()


def check_graph_settings() -> None:
    """Raise :class:`ConfigurationError` for the first invalid graph fusion setting."""
    for name in _GRAPH_NUMBERS:
        graph_number(name)


BACKGROUND_MODES = tuple(c for c in settings_schema.lookup("BACKGROUND").choices if c != "sync")
# "sync" is accepted for "inline" (what a script means by it).
_BACKGROUND_ALIASES = {"sync": "inline"}
# JOBS numbers: (minimum exclusive, integer?).
_JOBS_NUMBERS = {
    "THREADS": (0, True),
    "HEARTBEAT_SECONDS": (0, False),
    "STALLED_AFTER_SECONDS": (0, False),
    "POLL_SECONDS": (0, False),
}


def background_setting() -> str:
    """``BACKGROUND`` as one of :data:`BACKGROUND_MODES` (aliases resolved), or
    :class:`ConfigurationError`."""
    value = get_setting("BACKGROUND")
    mode = _BACKGROUND_ALIASES.get(value, value) if isinstance(value, str) else value
    if mode not in BACKGROUND_MODES:
        raise ConfigurationError(
            "BACKGROUND", value, f"use one of {', '.join(repr(m) for m in BACKGROUND_MODES)}"
        )
    return mode


def jobs_setting(name: str) -> float:
    """A ``JOBS`` number, checked: a bad value raises :class:`ConfigurationError`."""
    value = get_settings()["JOBS"][name]
    low, integer = _JOBS_NUMBERS[name]
    valid = isinstance(value, int | float) and not isinstance(value, bool) and value > low
    if integer and not isinstance(value, int):
        valid = False
    if not valid:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"JOBS.{name}", value, f"must be {kind}")
    return value


def check_background_settings() -> None:
    """Raise :class:`ConfigurationError` for an invalid ``BACKGROUND`` or ``JOBS`` value."""
    background_setting()
    for name in _JOBS_NUMBERS:
        jobs_setting(name)
    beat, stalled = jobs_setting("HEARTBEAT_SECONDS"), jobs_setting("STALLED_AFTER_SECONDS")
    if stalled <= 2 * beat:
        raise ConfigurationError(
            "JOBS.STALLED_AFTER_SECONDS",
            stalled,
            f"must be more than twice HEARTBEAT_SECONDS ({beat}), or live jobs show as stalled",
        )


MAX_DIMENSIONS = 2000  # pgvector's HNSW limit for `vector` columns
# pgvector's HNSW limit for `halfvec`: with VECTOR_INDEX_TYPE "halfvec" the column stays `vector`
# (which stores up to 16,000 dimensions) and the index holds `embedding::halfvec(n)`.
MAX_HALFVEC_DIMENSIONS = 4000
VECTOR_INDEX_LIMITS = {"vector": MAX_DIMENSIONS, "halfvec": MAX_HALFVEC_DIMENSIONS}


def vector_index_type() -> str:
    """``VECTOR_INDEX_TYPE``: ``"vector"`` or ``"halfvec"``, what the HNSW index holds."""
    return get_setting("VECTOR_INDEX_TYPE")


def check_index_dimensions(dims: int, setting: str = "EMBEDDING_DIMENSIONS", value=None) -> int:
    """``dims`` if the configured HNSW index type can index vectors of that size, else a
    :class:`ConfigurationError` naming ``setting`` (shown with ``value``, default ``dims``)
    and what to do."""
    kind = vector_index_type()
    limit = VECTOR_INDEX_LIMITS[kind]
    if dims <= limit:
        return dims
    if kind == "vector" and dims <= MAX_HALFVEC_DIMENSIONS:
        # pgvector's HNSW index takes `vector` columns of at most 2,000 dimensions: migrate
        # would fail creating it. Say so before, with what to do.
        fix = (
            "set VECTOR_INDEX_TYPE = 'halfvec' (half-precision vectors in the index, up to "
            "4,000 dimensions), or use a model that can shorten its vectors (OpenAI's "
            "text-embedding-3 models take dimensions=1536, for example) and set "
            "EMBEDDING_DIMENSIONS to that size"
        )
    else:
        fix = (
            "use an embedding model of at most 4,000 dimensions, or one that can shorten its "
            "vectors (OpenAI's text-embedding-3 models take dimensions=1536, for example)"
        )
    raise ConfigurationError(
        setting,
        dims if value is None else value,
        f"{dims} dimensions are above {limit}, the most pgvector's HNSW index takes for "
        f"{kind} (VECTOR_INDEX_TYPE = {kind!r}); {fix}",
    )


def embedding_dimensions() -> int:
    dims = get_setting("EMBEDDING_DIMENSIONS")
    if not isinstance(dims, int) or isinstance(dims, bool) or dims <= 0:
        raise ConfigurationError("EMBEDDING_DIMENSIONS", dims, "must be a positive integer")
    return check_index_dimensions(dims)


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


def deadline_setting(name: str) -> float | None:
    """``LLM_DEADLINE`` / ``AGENT_DEADLINE``: a positive number of seconds, or None."""
    value = get_setting(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigurationError(name, value, "must be a positive number of seconds, or None")
    return float(value)

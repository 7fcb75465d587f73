"""The ``DJANGO_RAG`` settings dict, its defaults, and component resolution.

Settings are read through :func:`get_settings`, which caches the merged dict and is reset when
Django's ``setting_changed`` signal fires (``override_settings`` in tests). Nothing reads
settings at import time.

Where things are: :mod:`.accessors` (the merged settings, typed accessors per section, checks,
the reset hook), :mod:`.secrets` (what a secret looks like; ``redact``, ``scrub_text``),
:mod:`.components` (building a pluggable part from its setting). Import from here.
"""

from __future__ import annotations

from .accessors import (
    BACKGROUND_MODES,
    DEFAULTS,
    FULLTEXT_BACKENDS,
    MAX_DIMENSIONS,
    MAX_HALFVEC_DIMENSIONS,
    SETTING_NAME,
    VECTOR_INDEX_LIMITS,
    background_setting,
    bm25_k3,
    call_defaults,
    check_background_settings,
    check_graph_settings,
    check_index_dimensions,
    check_search_budget,
    deadline_setting,
    embedding_dimensions,
    fulltext_backend_setting,
    get_setting,
    get_settings,
    graph_number,
    graph_setting,
    jobs_setting,
    max_query_terms,
    on_reset,
    search_setting,
    section_setting,
    statement_timeout,
    validate_settings,
    vector_index_type,
)
from .components import build_component, import_string
from .secrets import REDACTED, configured_secrets, is_secret_key, redact, scrub_text, secrets_in

__all__ = [
    "BACKGROUND_MODES",
    "DEFAULTS",
    "FULLTEXT_BACKENDS",
    "MAX_DIMENSIONS",
    "MAX_HALFVEC_DIMENSIONS",
    "REDACTED",
    "SETTING_NAME",
    "VECTOR_INDEX_LIMITS",
    "background_setting",
    "bm25_k3",
    "build_component",
    "call_defaults",
    "check_background_settings",
    "check_graph_settings",
    "check_index_dimensions",
    "check_search_budget",
    "configured_secrets",
    "deadline_setting",
    "embedding_dimensions",
    "fulltext_backend_setting",
    "get_setting",
    "get_settings",
    "graph_number",
    "graph_setting",
    "import_string",
    "is_secret_key",
    "jobs_setting",
    "max_query_terms",
    "on_reset",
    "redact",
    "scrub_text",
    "search_setting",
    "section_setting",
    "secrets_in",
    "statement_timeout",
    "validate_settings",
    "vector_index_type",
]

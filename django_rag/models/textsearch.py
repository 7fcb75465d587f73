"""The ``pg_textsearch`` full-text backend: BM25 from a ``bm25`` index on the chunk text.

``pg_textsearch`` (an extension by Tiger Data; PostgreSQL 17+) adds a ``bm25`` index access
method. Migration 0009 creates :data:`INDEX_NAME` on ``django_rag_chunk.text`` when the
extension is installed in the database, or can be (available and its library preloaded),
with the ``TEXT_SEARCH_CONFIG``, ``BM25_K1`` and ``BM25_B`` settings of that moment; on any
other server it does nothing. The index maintains itself: the write path does nothing for it.

``SEARCH["FULLTEXT_BACKEND"]`` picks the backend (:func:`fulltext_backend`): ``"auto"`` uses the
index where it exists, ``"sql"`` never does, ``"pg_textsearch"`` requires it.

What differs from the SQL backend (docs/search.md, "Full-text backends"): the index keeps one
set of statistics for the whole chunk table, so a search scoped to collections ranks with every
collection's document frequencies and lengths, not only its own; and its statistics count every
row version it indexed, rolled back, deleted and updated ones included, until it is rebuilt
(:func:`rebuild_index`; ``rag_maintenance fulltext-index`` compares :func:`counted_rows` with
the chunks and rebuilds it).
"""

from __future__ import annotations

import re

from django.db import connections, transaction
from django.db.utils import DatabaseError

from ..conf import fulltext_backend_setting, get_setting, on_reset, search_setting
from ..exceptions import ConfigurationError

INDEX_NAME = "django_rag_chunk_bm25_idx"
EXTENSION = "pg_textsearch"

# (alias, database name) -> (extension installed, index exists)
_states: dict[tuple[str, str], tuple[bool, bool]] = {}


def reset_index_state() -> None:
    """Forget what :func:`index_state` read (after creating or dropping the index)."""
    _states.clear()


on_reset(reset_index_state)


def extension_status(connection) -> tuple[bool, bool, bool]:
    """``(available, loaded, installed)`` for ``pg_textsearch`` on ``connection``: the server
    has it, its library is preloaded (``CREATE EXTENSION`` refuses otherwise), and it is
    installed in this database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = %s), "
            "current_setting('pg_textsearch.library_version', true) IS NOT NULL, "
            "EXISTS (SELECT 1 FROM pg_extension WHERE extname = %s)",
            [EXTENSION, EXTENSION],
        )
        available, loaded, installed = cursor.fetchone()
    return bool(available), bool(loaded), bool(installed)


def index_state(using: str = "default") -> tuple[bool, bool]:
    """``(extension installed, index exists)`` in the database of ``using`` (cached)."""
    connection = connections[using]
    key = (using, str(connection.settings_dict.get("NAME")))
    if key not in _states:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = %s), "
                "to_regclass(%s) IS NOT NULL",
                [EXTENSION, INDEX_NAME],
            )
            installed, exists = cursor.fetchone()
        _states[key] = (bool(installed), bool(exists))
    return _states[key]


def fulltext_backend(using: str = "default") -> str:
    """The full-text backend searches on ``using`` run: ``"sql"`` or ``"pg_textsearch"``.

    ``"auto"`` picks the index when the extension and the index exist. ``"pg_textsearch"``
    without them raises :class:`ConfigurationError` saying what to do (system check
    ``django_rag.E011`` reports it at startup)."""
    configured = fulltext_backend_setting()
    if configured == "sql":
        return "sql"
    installed, exists = index_state(using)
    if installed and exists:
        return "pg_textsearch"
    if configured == "auto":
        return "sql"
    raise ConfigurationError("SEARCH.FULLTEXT_BACKEND", configured, missing_reason(using))


def missing_reason(using: str = "default") -> str:
    """Why the ``pg_textsearch`` backend cannot run on ``using``, and what to do."""
    installed, exists = index_state(using)
    if not installed:
        return (
            f"the pg_textsearch extension is not installed in database {using!r}. Install it on "
            "the server (PostgreSQL 17+, 'pg_textsearch' in shared_preload_libraries, then a "
            "restart), run CREATE EXTENSION pg_textsearch; and migrate django_rag again "
            "(python manage.py migrate django_rag 0008 && python manage.py migrate django_rag) "
            "to build the index; or set SEARCH['FULLTEXT_BACKEND'] to 'auto' or 'sql'."
        )
    if not exists:
        return (
            f"the BM25 index {INDEX_NAME} is missing in database {using!r}: migrate django_rag "
            "again to build it (python manage.py migrate django_rag 0008 && python manage.py "
            "migrate django_rag), or set SEARCH['FULLTEXT_BACKEND'] to 'auto' or 'sql'."
        )
    return "it is available: nothing to do."


def create_index(connection) -> bool:
    """Create the extension (when it can be) and the BM25 index on ``connection``; returns
    whether the index exists afterwards. No-op where the extension cannot run, and where
    ``SEARCH["FULLTEXT_BACKEND"]`` is ``"sql"`` (the index would cost writes for nothing)."""
    if connection.vendor != "postgresql":
        return False
    try:
        if fulltext_backend_setting() == "sql":
            return False
    except ConfigurationError:
        pass  # reported by the system checks; build the index the other values would use
    available, loaded, installed = extension_status(connection)
    if not installed:
        if not (available and loaded):
            return False
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_textsearch")
        except DatabaseError:  # not allowed for this role: the SQL backend still serves
            return False
    config = get_setting("TEXT_SEARCH_CONFIG")
    k1, b = float(search_setting("BM25_K1")), float(search_setting("BM25_B"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::regconfig::text", [config])
        config_name = cursor.fetchone()[0]
        # Storage parameters take literals, not bind parameters: the values are a checked
        # configuration name and two floats.
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX_NAME} ON django_rag_chunk USING bm25 (text) "
            f"WITH (text_config = '{config_name.replace(chr(39), chr(39) * 2)}', "
            f"k1 = {k1!r}, b = {b!r})"
        )
    reset_index_state()
    return True


def rebuild_index(using: str = "default") -> None:
    """``REINDEX`` the BM25 index. Its statistics count every row version it indexed (rolled
    back inserts, deleted chunks, the old version of every updated chunk: a re-embedding
    updates them all) and, in pg_textsearch 1.0.0, VACUUM does not lower them; rebuilt, they
    count the live chunks again. It locks out writes to the chunk table while it runs (1.7 s
    for 13k chunks here)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"REINDEX INDEX {INDEX_NAME}")


def counted_rows(using: str = "default") -> int | None:
    """How many rows the BM25 index ranks with (its corpus statistics' document count): every
    row version it indexed, dead ones included, until :func:`rebuild_index`. None when the
    extension's summary does not say (a version other than 1.0 may word it otherwise)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT bm25_summarize_index(%s)", [INDEX_NAME])
        summary = cursor.fetchone()[0]
    found = re.search(r"total_docs:\s*(\d+)", summary or "")
    return int(found.group(1)) if found else None


def drop_index(connection) -> None:
    """Drop the BM25 index (the extension stays: other tables may use it)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX_NAME}")
    reset_index_state()


def index_options(using: str = "default") -> dict[str, str]:
    """The storage parameters the index was built with (``text_config``, ``k1``, ``b``)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass(%s)",
            [INDEX_NAME],
        )
        row = cursor.fetchone()
    options = {}
    for item in row[0] if row else []:
        key, _, value = item.partition("=")
        options[key] = value
    return options


def score_sql(words: list[str]) -> tuple[str, list]:
    """SQL (and params) of the index's BM25 *distance* of the current ``django_rag_chunk`` row
    for ``words``: the negated score (lower is better), as the ``<@>`` operator returns it.
    Ordering by it lets the index answer; computed alone (hybrid's candidates, the exact
    fallback) it reads the index's statistics for one row."""
    return (
        'django_rag_chunk."text" <@> to_bm25query(%s, %s)',
        [" ".join(words), INDEX_NAME],
    )

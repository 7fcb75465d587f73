"""System checks. Ids are stable; docs/configuration.md lists them with their fixes."""

from __future__ import annotations

from django.core import checks
from django.db import DatabaseError, connections, router

from .conf import (
    check_background_settings,
    check_graph_settings,
    check_search_budget,
    embedding_dimensions,
    fulltext_backend_setting,
    get_setting,
    get_settings,
    import_string,
    validate_settings,
    vector_index_type,
)
from .embeddings import get_embedder
from .exceptions import ConfigurationError, UnknownSetting
from .ingestion.chunkers import get_chunker
from .ingestion.parsers import get_parser, parser_registry
from .ingestion.parsers.registry import fallback_parser
from .models import Chunk, vector_index
from .retrieval.stores import get_vector_store
from .store.graph_stores import get_graph_store
from .store.vector_stores import writes_supported


def _chunk_db() -> str:

    return router.db_for_write(Chunk)


def _default_grounder():
    if get_setting("GROUNDER") is None:
        return None
    from .answers.grounding import get_grounder  # only when a check runs: commands start fast

    return get_grounder()


def _settings_error(exc: ConfigurationError) -> checks.Error:
    """E005 for a bad ``DJANGO_RAG`` value; for an unknown key the hint names the closest
    known one."""
    hint = "Fix DJANGO_RAG in your settings; docs/configuration.md lists every key."
    if isinstance(exc, UnknownSetting):
        section, _, _ = exc.setting.rpartition(".")
        where = f"DJANGO_RAG[{section!r}]" if section else "DJANGO_RAG"
        if exc.suggestions:
            hint = f"Did you mean {' or '.join(map(repr, exc.suggestions))}? " + hint
        else:
            hint = f"{where} knows {', '.join(exc.known)}. " + hint
    return checks.Error(str(exc), hint=hint, id="django_rag.E005")


@checks.register()
def check_settings(app_configs=None, **kwargs):
    """E002 (a component cannot be built), E003 (embedder size != EMBEDDING_DIMENSIONS), E005."""

    errors = []
    problems = validate_settings()
    if problems:
        return [_settings_error(exc) for exc in problems]
    try:
        dimensions = embedding_dimensions()
        check_graph_settings()
        check_background_settings()
        check_search_budget()
        fulltext_backend_setting()
    except ConfigurationError as exc:
        return [_settings_error(exc)]

    embedder = None
    for setting, build in (
        ("EMBEDDER", get_embedder),
        ("CHUNKER", get_chunker),
        ("VECTOR_STORE", get_vector_store),
        ("GROUNDER", _default_grounder),
        ("GRAPH", get_graph_store),  # GRAPH["STORE"]
    ):
        try:
            component = build()
        except ConfigurationError as exc:
            errors.append(
                checks.Error(
                    str(exc),
                    hint=f"DJANGO_RAG[{setting!r}] must be an alias, an importable dotted path, "
                    "a class, an instance or a callable.",
                    id="django_rag.E002",
                )
            )
            continue
        if setting == "EMBEDDER":
            embedder = component
        if setting == "VECTOR_STORE" and not writes_supported(component):
            errors.append(
                checks.Error(
                    f"The vector store {type(component).__name__} does not implement store(), "
                    "delete() and clear(): ingest would write PostgreSQL while searches ask a "
                    "store that never receives the chunks.",
                    hint="Implement the three write methods (see docs/search.md, 'Vector "
                    "stores'), or use VECTOR_STORE = 'pgvector'.",
                    id="django_rag.E007",
                )
            )
    try:
        for extension in parser_registry():
            get_parser(f"x{extension}", check_available=False)
        fallback_parser()
    except ConfigurationError as exc:
        errors.append(
            checks.Error(str(exc), hint="Fix DJANGO_RAG['PARSERS'].", id="django_rag.E002")
        )

    known = embedder.known_dimensions if embedder is not None else None
    if known is not None and known != dimensions:
        errors.append(
            checks.Error(
                f"The embedder {embedder.model_name!r} produces {known}-dimensional vectors but "
                f"DJANGO_RAG['EMBEDDING_DIMENSIONS'] is {dimensions}.",
                hint="Set EMBEDDING_DIMENSIONS to the embedder's size; if chunks are already "
                "stored, follow 'Changing the embedding model' in docs/configuration.md.",
                id="django_rag.E003",
            )
        )
    return errors


# The oldest servers django_rag runs on (docs/getting-started.md, "Requirements"). PostgreSQL 14 is
# Django 5.2's own floor (the SQL here needs 11: transition-table triggers, EXECUTE FUNCTION);
# pgvector 0.5 brought the HNSW index and hnsw.ef_search that every semantic search uses.
# Iterative index scans (pgvector 0.8) are used when present, never required.
MINIMUM_POSTGRESQL = (14,)
MINIMUM_PGVECTOR = (0, 5)


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _shown(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def server_versions(connection) -> tuple[tuple[int, ...], tuple | None, tuple | None]:
    """(PostgreSQL, installed pgvector, available pgvector) versions of ``connection``'s server;
    a pgvector version is None when the extension is not installed / not available."""
    number = connection.pg_version  # e.g. 180004 for 18.4, 90624 for 9.6.24
    postgresql = (
        divmod(number, 10000) if number >= 100000 else (number // 10000, number // 100 % 100)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT installed_version, default_version FROM pg_available_extensions "
            "WHERE name = 'vector'"
        )
        row = cursor.fetchone() or (None, None)
    return postgresql, _version(row[0]), _version(row[1])


def _version_errors(postgresql, installed, available) -> list:
    errors = []
    if postgresql < MINIMUM_POSTGRESQL:
        errors.append(
            checks.Error(
                f"The PostgreSQL server is version {_shown(postgresql)}; django_rag needs "
                f"PostgreSQL {_shown(MINIMUM_POSTGRESQL)} or newer.",
                hint="Upgrade the server (pg_upgrade, or dump and restore into a new one); "
                "docs/getting-started.md ('Requirements') lists the supported versions.",
                id="django_rag.E008",
            )
        )
    pgvector = installed or available
    if pgvector < MINIMUM_PGVECTOR:
        where = "installed in this database" if installed else "available on the server"
        if installed and available and available >= MINIMUM_PGVECTOR:
            hint = (
                f"The server has pgvector {_shown(available)}: run ALTER EXTENSION vector UPDATE; "
                "in this database."
            )
        else:
            hint = (
                "Upgrade pgvector on the server (0.8 or newer recommended: filtered searches "
                "use iterative index scans), then run ALTER EXTENSION vector UPDATE; in this "
                "database."
            )
        errors.append(
            checks.Error(
                f"pgvector {_shown(pgvector)} is {where}; django_rag needs pgvector "
                f"{_shown(MINIMUM_PGVECTOR)} or newer (HNSW indexes).",
                hint=hint,
                id="django_rag.E009",
            )
        )
    return errors


@checks.register(checks.Tags.database)
def check_database(app_configs=None, databases=None, **kwargs):
    """E001 (pgvector unavailable), E004 (column size != EMBEDDING_DIMENSIONS), E008 and E009
    (PostgreSQL or pgvector older than supported), E013 (``VECTOR_INDEX_TYPE`` "halfvec" on a
    pgvector without it), W007 (the HNSW index is not of ``VECTOR_INDEX_TYPE``), W001, W002."""

    alias = _chunk_db()
    if databases is None or alias not in databases:
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return [
            checks.Warning(
                f"Database {alias!r} is {connection.vendor}; django_rag needs PostgreSQL with "
                "the pgvector extension.",
                hint="Point DATABASES at PostgreSQL (or use django_rag.embedded for development).",
                id="django_rag.W001",
            )
        ]
    try:
        postgresql, installed, available = server_versions(connection)
        if available is None and installed is None:
            return [
                checks.Error(
                    "The pgvector extension is not available on the PostgreSQL server.",
                    hint="Install pgvector on the server (e.g. the postgresql-18-pgvector "
                    "package); migrate then creates the extension.",
                    id="django_rag.E001",
                )
            ]
        errors = _version_errors(postgresql, installed, available)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding' "
                "AND NOT a.attisdropped",
                [Chunk._meta.db_table],
            )
            column = cursor.fetchone()
        index = vector_index.installed_index(connection) if column is not None else None
    except DatabaseError as exc:
        return [
            checks.Warning(
                f"Could not inspect database {alias!r}: {exc}",
                hint="Check DATABASES; django_rag's database checks were skipped.",
                id="django_rag.W002",
            )
        ]
    if column is not None:
        declared = column[0]
        expected = f"vector({embedding_dimensions()})"
        if declared != expected:
            errors.append(
                checks.Error(
                    f"The chunk embedding column is {declared} but "
                    f"DJANGO_RAG['EMBEDDING_DIMENSIONS'] asks for {expected}.",
                    hint="Either set EMBEDDING_DIMENSIONS back to the column's size, or change "
                    "model as described in docs/configuration.md ('Changing the embedding "
                    "model').",
                    id="django_rag.E004",
                )
            )
    errors.extend(_index_type_messages(installed or available, column, index))
    return errors


def _index_type_messages(pgvector, column, index) -> list:
    """E013: ``VECTOR_INDEX_TYPE`` is "halfvec" but pgvector has no halfvec (before 0.7).
    W007: the chunk table's HNSW index is missing or of another type than the setting."""
    try:
        kind = vector_index_type()
    except ConfigurationError:
        return []  # reported as E005 by check_settings
    if pgvector < vector_index.MINIMUM_PGVECTOR[kind]:
        if kind == "vector":
            return []  # E009
        return [
            checks.Error(
                f"DJANGO_RAG['VECTOR_INDEX_TYPE'] is 'halfvec' but pgvector {_shown(pgvector)} "
                "has no halfvec type (pgvector 0.7 brought it): the index cannot be built and "
                "semantic searches would fail.",
                hint="Upgrade pgvector on the server to 0.7 or newer and run ALTER EXTENSION "
                "vector UPDATE; in this database, or set VECTOR_INDEX_TYPE back to 'vector' "
                "(docs/scaling.md, 'Half-precision index').",
                id="django_rag.E013",
            )
        ]
    if column is None:
        return []  # not migrated yet: migrate builds the index of the configured type
    dimensions = int(column[0].partition("(")[2].rstrip(")") or 0) or None
    if index is not None and index.matches(kind, dimensions):
        return []
    if index is None:
        problem = "is missing"
    else:
        problem = (
            f"holds {index.describe()} but DJANGO_RAG['VECTOR_INDEX_TYPE'] is {kind!r} "
            f"(semantic searches order by the {kind} distance, which it cannot serve)"
        )
    return [
        checks.Warning(
            f"The HNSW index of the chunk vectors ({vector_index.HNSW_INDEX}) {problem}: every semantic "
            "search scans every chunk.",
            hint="Rebuild the index of the configured type: python manage.py rag_maintenance "
            "vector-index --apply (built concurrently: searches and writes go on meanwhile); "
            "or set VECTOR_INDEX_TYPE back to the index's type.",
            id="django_rag.W007",
        )
    ]


@checks.register(checks.Tags.urls)
def check_dashboard(app_configs=None, **kwargs):
    """The dashboard's templates need django-htmx installed as an app."""
    from django.apps import apps
    from django.conf import settings
    from django.urls import NoReverseMatch, reverse

    if not getattr(settings, "ROOT_URLCONF", None):
        return []  # no URLs at all (a worker-only or command-line project): nothing mounted
    try:
        reverse("django_rag_dashboard:home")
    except NoReverseMatch:
        return []  # the dashboard is not mounted
    if apps.is_installed("django_htmx"):
        return []
    return [
        checks.Error(
            "The django_rag dashboard is mounted but django_htmx is not in INSTALLED_APPS.",
            hint='pip install "django-rag[dashboard]" and add "django_htmx" to INSTALLED_APPS '
            '(and "django_htmx.middleware.HtmxMiddleware" to MIDDLEWARE).',
            id="django_rag.E006",
        )
    ]


@checks.register()
def check_search_database(app_configs=None, **kwargs):
    """E010: ``SEARCH["DATABASE"]`` names no alias of ``DATABASES``."""
    from django.conf import settings

    try:
        alias = get_settings()["SEARCH"].get("DATABASE")
    except ConfigurationError:
        return []  # reported as E005 by check_settings
    if not isinstance(alias, str) or alias in settings.DATABASES:
        return []  # None: the routers choose; not a string: reported as E005 (its type)
    return [
        checks.Error(
            f"DJANGO_RAG['SEARCH']['DATABASE'] is {alias!r}, which is not an alias of "
            f"DATABASES ({', '.join(sorted(settings.DATABASES))}).",
            hint="Name a DATABASES alias (a read replica), or None to let DATABASE_ROUTERS "
            "choose (docs/scaling.md).",
            id="django_rag.E010",
        )
    ]


@checks.register(checks.Tags.database)
def check_fulltext_backend(app_configs=None, databases=None, **kwargs):
    """E011: ``SEARCH["FULLTEXT_BACKEND"]`` is ``"pg_textsearch"`` but the database searched
    lacks the extension or its BM25 index. W003: the index was built with another text search
    configuration or BM25 parameters than the settings now give."""
    from .conf import get_setting, search_setting
    from .models.databases import search_db
    from .models.textsearch import index_options, index_state, missing_reason, reset_index_state

    try:
        configured = fulltext_backend_setting()
        alias = search_db()
    except ConfigurationError:
        return []  # reported as E005 / E010
    if configured == "sql" or databases is None or alias not in databases:
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    try:
        reset_index_state()  # a check reads the database as it is now
        installed, exists = index_state(alias)
        options = index_options(alias) if installed and exists else {}
    except DatabaseError:
        return []  # W002 reports a database that cannot be inspected
    if not (installed and exists):
        if configured == "auto":
            return []
        return [
            checks.Error(
                f"DJANGO_RAG['SEARCH']['FULLTEXT_BACKEND'] is 'pg_textsearch' but "
                f"{missing_reason(alias)}",
                hint="docs/search.md ('Full-text backends') says how to install pg_textsearch; "
                "'auto' uses it only where it exists.",
                id="django_rag.E011",
            )
        ]
    expected = {
        "text_config": str(get_setting("TEXT_SEARCH_CONFIG")),
        "k1": float(search_setting("BM25_K1")),
        "b": float(search_setting("BM25_B")),
    }
    built = {
        "text_config": options.get("text_config", ""),
        "k1": float(options.get("k1", 1.2)),
        "b": float(options.get("b", 0.75)),
    }
    if built != expected:
        return [
            checks.Warning(
                f"The pg_textsearch index was built with {built} but the settings now give "
                f"{expected}: full-text search on the index ranks with the values it was "
                "built with.",
                hint="Rebuild it: python manage.py migrate django_rag 0008 && python manage.py "
                "migrate django_rag (and run index_chunks() after changing TEXT_SEARCH_CONFIG).",
                id="django_rag.W003",
            )
        ]
    return []


def _api_mounted() -> bool:
    from django.conf import settings
    from django.urls import NoReverseMatch, reverse

    if not getattr(settings, "ROOT_URLCONF", None):
        return False
    try:
        reverse("django_rag_api:search")
    except NoReverseMatch:
        return False
    return True


def _has_middleware(base_path: str) -> bool:
    """Whether MIDDLEWARE holds ``base_path`` or a subclass of it (a project's own session
    middleware usually extends Django's)."""
    from django.conf import settings
    from django.utils.module_loading import import_string as django_import

    base = django_import(base_path)
    for entry in getattr(settings, "MIDDLEWARE", None) or ():
        if entry == base_path:
            return True
        try:
            found = django_import(entry)
        except ImportError:
            continue  # Django itself reports a middleware that does not import
        if isinstance(found, type) and issubclass(found, base):
            return True
    return False


@checks.register(checks.Tags.urls, checks.Tags.security)
def check_api(app_configs=None, **kwargs):
    """E012: ``API["AUTHENTICATE"]`` does not import or is not callable. When the API is mounted
    and callers need Django's session (no hook is set, or ``API["ANONYMOUS"]`` lets visitors
    chat, their conversations kept in the session): W004, sessions or authentication missing;
    W005, ``CsrfViewMiddleware`` missing."""
    from django.apps import apps

    try:
        api = get_settings()["API"]
    except ConfigurationError:
        return []  # reported as E005 by check_settings
    hook = api.get("AUTHENTICATE")
    if isinstance(hook, str):
        try:
            hook = import_string(hook, setting="API.AUTHENTICATE")
        except ConfigurationError as exc:
            return [
                checks.Error(
                    str(exc),
                    hint="Give API['AUTHENTICATE'] the dotted path of a function "
                    "(request) -> user or None, or the function itself (docs/api.md).",
                    id="django_rag.E012",
                )
            ]
    if hook is not None and not callable(hook):
        return [
            checks.Error(
                f"DJANGO_RAG['API']['AUTHENTICATE'] is {hook!r}, which is not callable.",
                hint="Give it a function (request) -> user or None, or its dotted path "
                "(docs/api.md).",
                id="django_rag.E012",
            )
        ]
    anonymous = bool(api.get("ANONYMOUS"))
    if (hook is not None and not anonymous) or not _api_mounted():
        return []
    if hook is None:
        why = "has no API['AUTHENTICATE'] hook, so callers sign in through Django's session"
    else:
        why = "lets anonymous visitors in (API['ANONYMOUS']), their chats kept in the session"
    errors = []
    missing = []
    if not apps.is_installed("django.contrib.sessions"):
        missing.append("'django.contrib.sessions' in INSTALLED_APPS")
    if not _has_middleware("django.contrib.sessions.middleware.SessionMiddleware"):
        missing.append("SessionMiddleware in MIDDLEWARE")
    if not _has_middleware("django.contrib.auth.middleware.AuthenticationMiddleware"):
        missing.append("AuthenticationMiddleware in MIDDLEWARE")
    if missing:
        errors.append(
            checks.Warning(
                f"The django_rag API is mounted and {why}, but " + ", ".join(missing) + " is "
                "missing: session callers would answer 401 and anonymous ones fail.",
                hint="Add django.contrib.sessions, SessionMiddleware and AuthenticationMiddleware "
                "(in that order), or set API['AUTHENTICATE'] for token auth and leave "
                "API['ANONYMOUS'] off (docs/api.md).",
                id="django_rag.W004",
            )
        )
    if not _has_middleware("django.middleware.csrf.CsrfViewMiddleware"):
        errors.append(
            checks.Warning(
                f"The django_rag API is mounted and {why}, but CsrfViewMiddleware is missing: "
                "browsers never receive the csrftoken cookie, so every POST and DELETE through "
                "the session (or anonymous) answers 403 csrf_failed.",
                hint="Add 'django.middleware.csrf.CsrfViewMiddleware' to MIDDLEWARE, or set "
                "API['AUTHENTICATE'] for token auth and leave API['ANONYMOUS'] off "
                "(docs/api.md).",
                id="django_rag.W005",
            )
        )
    return errors


@checks.register(checks.Tags.urls, checks.Tags.security)
def check_api_scope(app_configs=None, **kwargs):
    """W006: the API is mounted and nothing says who reads what through it (no
    ``DASHBOARD["COLLECTIONS"]``, no ``API["READ_ALL"]``): only active staff read collections,
    every other caller nothing. The hint says how to open it."""
    try:
        settings = get_settings()
    except ConfigurationError:
        return []  # reported as E005 by check_settings
    if settings["DASHBOARD"].get("COLLECTIONS") is not None:
        return []
    if settings["API"].get("READ_ALL") is not None or not _api_mounted():
        return []
    return [
        checks.Warning(
            "The django_rag API is mounted and its collection scope is unconfigured "
            "(DASHBOARD['COLLECTIONS'] and API['READ_ALL'] are not set): only active staff "
            "read collections through it; other logged-in users and anonymous visitors read "
            "nothing (searches answer 403, listings are empty).",
            hint="Give DASHBOARD['COLLECTIONS'] a function (user) -> collection names for a "
            "per-user scope, or set API['READ_ALL'] = 'authenticated' to let every logged-in "
            "user read every collection ('anyone' adds anonymous visitors when "
            "API['ANONYMOUS'] is on); API['READ_ALL'] = 'staff' keeps the default and "
            "silences this warning (docs/api.md#scope).",
            id="django_rag.W006",
        )
    ]


# Cache backends whose ``incr`` reads the value and writes it back (Django's ``BaseCache.incr``)
# or keeps nothing: concurrent requests lose counts, and limits stop holding.
_NON_ATOMIC_CACHES = {
    "django.core.cache.backends.db.DatabaseCache": "the database cache",
    "django.core.cache.backends.filebased.FileBasedCache": "the file-based cache",
    "django.core.cache.backends.dummy.DummyCache": "the dummy cache (it keeps nothing)",
}


@checks.register(checks.Tags.caches, checks.Tags.security)
def check_api_cache(app_configs=None, **kwargs):
    """W008: the API is mounted with a rate limit or token budget, and ``API["CACHE"]`` is a
    cache whose ``incr`` is not atomic (database, file-based) or that keeps nothing (dummy):
    concurrent requests lose counts, so neither limit holds."""
    from django.conf import settings as django_settings

    try:
        api = get_settings()["API"]
    except ConfigurationError:
        return []  # reported as E005 by check_settings
    if api.get("RATE_LIMIT") is None and api.get("TOKEN_BUDGET") is None:
        return []
    alias = api.get("CACHE")
    backend = (getattr(django_settings, "CACHES", None) or {}).get(alias, {}).get("BACKEND", "")
    kind = _NON_ATOMIC_CACHES.get(backend)
    if kind is None or not _api_mounted():
        return []
    return [
        checks.Warning(
            f"API['CACHE'] ({alias!r}) is {kind}, whose counters are not atomic: concurrent "
            "requests lose counts, so the API's rate limit and token budget do not hold.",
            hint="Point API['CACHE'] at a cache shared by every web process with an atomic "
            "incr: Redis (django.core.cache.backends.redis.RedisCache) or Memcached "
            "(docs/security.md#rate-limits-and-token-budgets).",
            id="django_rag.W008",
        )
    ]

"""System checks. Ids are stable; docs/configuration.md lists them with their fixes."""

from __future__ import annotations

from django.core import checks
from django.db import DatabaseError, connections, router

from .conf import embedding_dimensions, get_settings
from .embeddings import get_embedder
from .exceptions import ConfigurationError
from .ingestion.chunkers import get_chunker
from .ingestion.parsers import get_parser, parser_registry
from .models import Chunk
from .retrieval.stores import get_vector_store
from .store.vector_stores import writes_supported


def _chunk_db() -> str:

    return router.db_for_write(Chunk)


@checks.register()
def check_settings(app_configs=None, **kwargs):
    """E002 (a component cannot be built), E003 (embedder size != EMBEDDING_DIMENSIONS), E005."""

    errors = []
    try:
        get_settings()
        dimensions = embedding_dimensions()
    except ConfigurationError as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix DJANGO_RAG in your settings; docs/configuration.md lists every key.",
                id="django_rag.E005",
            )
        ]

    embedder = None
    for setting, build in (
        ("EMBEDDER", get_embedder),
        ("CHUNKER", get_chunker),
        ("VECTOR_STORE", get_vector_store),
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
            get_parser(f"x{extension}")
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


@checks.register(checks.Tags.database)
def check_database(app_configs=None, databases=None, **kwargs):
    """E001 (pgvector unavailable), E004 (column size != EMBEDDING_DIMENSIONS), W001."""

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
    errors = []
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT installed_version, default_version FROM pg_available_extensions "
                "WHERE name = 'vector'"
            )
            row = cursor.fetchone()
            if row is None:
                errors.append(
                    checks.Error(
                        "The pgvector extension is not available on the PostgreSQL server.",
                        hint="Install pgvector on the server (e.g. the postgresql-16-pgvector "
                        "package); migrate then creates the extension.",
                        id="django_rag.E001",
                    )
                )
                return errors
            cursor.execute(
                "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding' "
                "AND NOT a.attisdropped",
                [Chunk._meta.db_table],
            )
            column = cursor.fetchone()
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
    return errors


@checks.register(checks.Tags.urls)
def check_dashboard(app_configs=None, **kwargs):
    """The dashboard's templates need django-htmx installed as an app."""
    from django.apps import apps
    from django.urls import NoReverseMatch, reverse

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
    if alias is None or (isinstance(alias, str) and alias in settings.DATABASES):
        return []
    return [
        checks.Error(
            f"DJANGO_RAG['SEARCH']['DATABASE'] is {alias!r}, which is not an alias of "
            f"DATABASES ({', '.join(sorted(settings.DATABASES))}).",
            hint="Name a DATABASES alias (a read replica), or None to let DATABASE_ROUTERS "
            "choose (docs/scaling.md).",
            id="django_rag.E010",
        )
    ]

import sys

import pytest
from django.conf import settings
from django.contrib.sessions.middleware import SessionMiddleware
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from django_rag.checks import check_database, check_settings
from django_rag.conf import get_settings
from django_rag.exceptions import ConfigurationError, MissingDependency

pytestmark = pytest.mark.django_db


def ids(messages):
    return [m.id for m in messages]


def test_default_configuration_passes():
    assert check_settings() == []
    assert check_database(databases=["default"]) == []


def test_bad_dotted_path_is_e002(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "myproject.nope.Embedder"}
    (error,) = check_settings()
    assert (
        error.id == "django_rag.E002" and "myproject.nope" in error.msg and "EMBEDDER" in error.msg
    )


def test_bad_parser_path_is_e002(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PARSERS": {".html": "nowhere.HtmlParser"}}
    assert ids(check_settings()) == ["django_rag.E002"]


def test_embedder_size_differs_from_setting_is_e003(settings):
    settings.DJANGO_RAG = {"EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 768}}}
    (error,) = check_settings()
    assert error.id == "django_rag.E003" and "768" in error.msg and "384" in error.msg


def test_minilm_default_is_known_without_loading(settings):
    settings.DJANGO_RAG = {"EMBEDDING_DIMENSIONS": 768}  # default embedder: MiniLM, 384
    assert ids(check_settings()) == ["django_rag.E003"]


def test_column_size_differs_from_setting_is_e004(settings):
    settings.DJANGO_RAG = {
        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 768}},
        "EMBEDDING_DIMENSIONS": 768,
    }
    (error,) = check_database(databases=["default"])
    assert error.id == "django_rag.E004"
    assert "vector(384)" in error.msg and "vector(768)" in error.msg
    with pytest.raises(SystemCheckError, match="E004"):
        call_command("check", "--database", "default")


def test_pgvector_missing_is_e001(monkeypatch):
    original = connection.cursor

    class Cursor:
        def __init__(self, inner):
            self.inner = inner

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def execute(self, sql, params=None):
            sql = sql.replace("name = 'vector'", "name = 'no_such_extension'")
            return self.inner.execute(sql, params)

        def fetchone(self):
            return self.inner.fetchone()

    monkeypatch.setattr(connection, "cursor", lambda: Cursor(original()))
    assert ids(check_database(databases=["default"])) == ["django_rag.E001"]


def test_invalid_settings_are_e005(settings):
    settings.DJANGO_RAG = {"EMBEDING": "typo"}
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and "EMBEDING" in error.msg
    settings.DJANGO_RAG = {"EMBEDDING_DIMENSIONS": 0}
    assert ids(check_settings()) == ["django_rag.E005"]


def test_dimensions_above_the_hnsw_limit_are_e005_before_migrate(settings):
    """pgvector's HNSW index takes vector columns of at most 2,000 dimensions: migrate would
    fail creating it, so the check says what to do first."""
    settings.DJANGO_RAG = {
        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 3072}},
        "EMBEDDING_DIMENSIONS": 3072,
    }
    errors = check_settings()
    assert [e.id for e in errors] == ["django_rag.E005"]
    assert "2000" in errors[0].msg and "dimensions=1536" in errors[0].msg
    settings.DJANGO_RAG = {
        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 2000}},
        "EMBEDDING_DIMENSIONS": 2000,
    }
    assert check_settings() == []


def test_settings_cache_resets_on_override(settings):
    settings.DJANGO_RAG = {"DEFAULT_COLLECTION": "first"}
    assert get_settings()["DEFAULT_COLLECTION"] == "first"
    settings.DJANGO_RAG = {"DEFAULT_COLLECTION": "second", "SEARCH": {"LIMIT": 3}}
    assert get_settings()["DEFAULT_COLLECTION"] == "second"
    assert get_settings()["SEARCH"]["LIMIT"] == 3
    assert get_settings()["SEARCH"]["MODE"] == "semantic"  # nested defaults kept


def test_configuration_error_is_improperly_configured():
    from django.core.exceptions import ImproperlyConfigured

    error = ConfigurationError("EMBEDDER", "x", "bad")
    assert isinstance(error, ImproperlyConfigured) and error.code == "configuration_error"


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from django_rag import utils
    from django_rag.embeddings import sentence_transformers as st
    from django_rag.ingestion.parsers import parse_bytes

    monkeypatch.setitem(sys.modules, "pymupdf", None)
    with pytest.raises(MissingDependency, match=r"pip install 'django-rag\[pdf\]'"):
        parse_bytes(b"%PDF-1.7", filename="a.pdf")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    monkeypatch.setattr(utils, "_loaded", {})
    with pytest.raises(MissingDependency, match=r"django-rag\[local\]"):
        st.SentenceTransformerEmbedder(encoder="sentence-transformers").embed_query("x")
    # The bundled model's own encoder needs tokenizers and torch (the same extra).
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingDependency, match=r"django-rag\[local\]"):
        st.SentenceTransformerEmbedder().embed_query("x")
    monkeypatch.setitem(sys.modules, "litellm", None)
    from django_rag.embeddings import LiteLLMEmbedder

    with pytest.raises(MissingDependency, match=r"django-rag\[llm\]"):
        LiteLLMEmbedder().embed_query("x")


def test_dashboard_needs_django_htmx():
    from django.test import override_settings

    from django_rag.checks import check_dashboard

    assert check_dashboard() == []
    apps = [app for app in settings.INSTALLED_APPS if app != "django_htmx"]
    with override_settings(INSTALLED_APPS=apps):
        errors = check_dashboard()
    assert [e.id for e in errors] == ["django_rag.E006"] and "INSTALLED_APPS" in errors[0].hint


def test_a_store_that_cannot_receive_writes_is_e007(settings):
    from django_rag.store.vector_stores import VectorStore

    class SearchOnly(VectorStore):
        def search(self, request):
            return []

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": SearchOnly()}
    assert ids(check_settings()) == ["django_rag.E007"]
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": "memory"}
    assert check_settings() == []


def test_current_servers_meet_the_minimum_versions():
    from django_rag import checks as rag_checks

    postgresql, installed, available = rag_checks.server_versions(connection)
    assert postgresql >= rag_checks.MINIMUM_POSTGRESQL
    assert installed >= rag_checks.MINIMUM_PGVECTOR and available >= installed
    assert postgresql[0] * 10000 <= connection.pg_version < (postgresql[0] + 1) * 10000
    messages = ids(check_database(databases=["default"]))
    assert "django_rag.E008" not in messages and "django_rag.E009" not in messages


@pytest.mark.parametrize(
    ("versions", "expected", "says"),
    [
        (((13, 9), (0, 8, 0), (0, 8, 0)), ["django_rag.E008"], ["13.9", "PostgreSQL 14"]),
        (((16, 2), (0, 4, 4), (0, 4, 4)), ["django_rag.E009"], ["0.4.4", "Upgrade pgvector"]),
        (
            ((16, 2), (0, 4, 4), (0, 8, 1)),
            ["django_rag.E009"],
            ["installed in this database", "ALTER EXTENSION vector UPDATE"],
        ),
        (((18, 1), None, (0, 4, 0)), ["django_rag.E009"], ["available on the server"]),
        (((12, 0), (0, 4, 0), (0, 4, 0)), ["django_rag.E008", "django_rag.E009"], []),
        (((14, 0), None, (0, 5, 0)), [], []),
    ],
)
def test_older_servers_are_e008_and_e009(monkeypatch, versions, expected, says):
    from django_rag import checks as rag_checks

    monkeypatch.setattr(rag_checks, "server_versions", lambda connection: versions)
    messages = check_database(databases=["default"])
    assert ids(messages) == expected
    text = " ".join(f"{m.msg} {m.hint}" for m in messages)
    assert all(part in text for part in says), text
    if expected:
        with pytest.raises(SystemCheckError, match=expected[0]):
            call_command("check", "--database", "default")


def test_a_project_without_urls_passes_the_dashboard_check():
    from django.test import override_settings

    from django_rag.checks import check_dashboard

    with override_settings(ROOT_URLCONF=None):
        assert check_dashboard() == []


# --- the HTTP API (W004, W005, E012) -----------------------------------------------------------

SESSION_MW = "django.contrib.sessions.middleware.SessionMiddleware"
AUTH_MW = "django.contrib.auth.middleware.AuthenticationMiddleware"
CSRF_MW = "django.middleware.csrf.CsrfViewMiddleware"


def api_checks():
    from django_rag.checks import check_api

    return check_api()


needs_api = pytest.mark.skipif(
    __import__("importlib").util.find_spec("ninja") is None,
    reason="the API needs the 'api' extra (django-ninja); tests.urls mounts it only then",
)


def without(*names):
    return [entry for entry in settings.MIDDLEWARE if entry not in names]


@needs_api
def test_the_test_site_mounts_the_api_and_passes():
    assert api_checks() == []


@needs_api
def test_api_without_sessions_and_no_hook_is_w004(settings):
    settings.MIDDLEWARE = without(SESSION_MW, AUTH_MW)
    (warning,) = api_checks()
    assert warning.id == "django_rag.W004"
    assert "SessionMiddleware" in warning.msg and "AuthenticationMiddleware" in warning.msg
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django.contrib.sessions"]
    (warning,) = api_checks()
    assert "django.contrib.sessions" in warning.msg


@needs_api
def test_api_without_csrf_middleware_and_no_hook_is_w005(settings):
    settings.MIDDLEWARE = without(CSRF_MW)
    assert ids(api_checks()) == ["django_rag.W005"]
    with pytest.raises(SystemCheckError, match="W005"):
        call_command("check", "--fail-level", "WARNING")


@needs_api
def test_a_subclass_of_the_middleware_counts(settings):
    settings.MIDDLEWARE = [
        "tests.test_checks.OwnSessionMiddleware" if m == SESSION_MW else m
        for m in settings.MIDDLEWARE
    ]
    assert api_checks() == []


@needs_api
def test_a_token_hook_makes_sessions_and_csrf_optional(settings):
    settings.MIDDLEWARE = without(SESSION_MW, AUTH_MW, CSRF_MW)
    assert ids(api_checks()) == ["django_rag.W004", "django_rag.W005"]
    settings.DJANGO_RAG = {"API": {"AUTHENTICATE": "tests.test_api.token_user"}}
    assert api_checks() == []
    # ... unless anonymous visitors are let in: their chats live in the session.
    settings.DJANGO_RAG = {"API": {"AUTHENTICATE": "tests.test_api.token_user", "ANONYMOUS": True}}
    warning, _ = api_checks()
    assert warning.id == "django_rag.W004" and "API['ANONYMOUS']" in warning.msg


@needs_api
def test_unmounted_api_is_not_checked(settings):
    settings.MIDDLEWARE = without(SESSION_MW, AUTH_MW, CSRF_MW)
    settings.ROOT_URLCONF = "tests.test_checks"  # a urlconf without the API
    assert api_checks() == []


urlpatterns: list = []  # ROOT_URLCONF of the test above


# --- the API's scope (W006) ------------------------------------------------------------------


def scope_checks():
    from django_rag.checks import check_api_scope

    return check_api_scope()


@needs_api
def test_a_mounted_api_without_a_scope_is_w006_with_a_hint_that_opens_it(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    (warning,) = scope_checks()
    assert warning.id == "django_rag.W006" and warning.level == checks.WARNING
    assert "DASHBOARD['COLLECTIONS']" in warning.msg and "API['READ_ALL']" in warning.msg
    assert "API['READ_ALL'] = 'authenticated'" in warning.hint
    assert "DASHBOARD['COLLECTIONS']" in warning.hint
    with pytest.raises(SystemCheckError, match="W006"):
        call_command("check", "--fail-level", "WARNING")


@needs_api
@pytest.mark.parametrize("read_all", ["staff", "authenticated", "anyone"])
def test_read_all_or_a_scope_function_silences_w006(settings, read_all):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"READ_ALL": read_all}}
    assert scope_checks() == []
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "DASHBOARD": {"COLLECTIONS": "tests.test_api.tenant_scope"},
    }
    assert scope_checks() == []


@needs_api
def test_w006_is_not_raised_for_an_unmounted_api_or_a_bad_setting(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"READ_ALL": "everybody"}}
    assert scope_checks() == []  # E005 reports the value
    assert any(e.id == "django_rag.E005" and "READ_ALL" in e.msg for e in check_settings())
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    settings.ROOT_URLCONF = "tests.test_checks"  # a urlconf without the API
    assert scope_checks() == []


def test_authenticate_hook_that_does_not_import_is_e012(settings):
    settings.DJANGO_RAG = {"API": {"AUTHENTICATE": "myproject.nope.api_key_user"}}
    (error,) = api_checks()
    assert error.id == "django_rag.E012"
    assert "myproject.nope" in error.msg and "API.AUTHENTICATE" in error.msg
    settings.DJANGO_RAG = {"API": {"AUTHENTICATE": "tests.test_checks.no_such_function"}}
    assert ids(api_checks()) == ["django_rag.E012"]


def test_authenticate_hook_that_is_not_callable_is_e012(settings):
    settings.DJANGO_RAG = {"API": {"AUTHENTICATE": 42}}
    (error,) = api_checks()
    assert error.id == "django_rag.E012" and "42" in error.msg


class OwnSessionMiddleware(SessionMiddleware):
    """A project's own session middleware, as many projects have."""

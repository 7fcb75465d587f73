"""Settings for the benchmarks: the embedded PostgreSQL (or DATABASE_URL) and real MiniLM."""

import os
import tempfile
from pathlib import Path

from django_rag.embedded import database_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SECRET_KEY = "benchmarks-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.postgres",
    "django_rag",
]
# DJANGO_RAG_BENCHMARK_DB: another embedded server directory (so runs do not share one).
DATABASES = {
    "default": database_settings(
        os.environ.get("DJANGO_RAG_BENCHMARK_DB")
        or Path(tempfile.gettempdir()) / "django_rag_benchmarks"
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DJANGO_RAG = {}

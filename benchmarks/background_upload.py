"""How long the dashboard's upload holds the browser, per background mode: the upload view's
response time and the time until its job has completed, for one file.

    python benchmarks/background_upload.py                                   # the 117-page PDF
    python benchmarks/background_upload.py --file manual.pdf --modes thread
    python benchmarks/background_upload.py --embedder hashing                # no model

Each mode posts the same file through Django's test client to the real upload view (a staff
user, the dashboard's URLs) and then polls the job row until it is completed. "worker" runs a
``rag_worker`` loop in a thread of this process once the response is back (the same claim and
task as the command). The embedder is the bundled MiniLM unless ``--embedder`` says otherwise.
It runs in its own embedded PostgreSQL (data in ``DJANGO_RAG_BENCHMARK_DB``, default
``<tmp>/django_rag_background_upload``; ``DATABASE_URL`` selects a server instead).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

DATA_DIR = Path(
    os.environ.get("DJANGO_RAG_BENCHMARK_DB")
    or Path(tempfile.gettempdir()) / "django_rag_background_upload"
)
PDF = ROOT.parent / "shared" / "data" / "pdfs" / "book_geotopo_german_lecture_notes_117p.pdf"
DATABASE = "background_upload"


def configure(embedder: str) -> None:
    from django_rag.embedded import database_settings

    db = database_settings(None if os.environ.get("DATABASE_URL") else DATA_DIR)
    settings.configure(
        SECRET_KEY="benchmarks-only",
        USE_TZ=True,
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.postgres",
            "django_htmx",
            "django_rag",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django_htmx.middleware.HtmxMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
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
        ],
        DATABASES={"default": {**db, "NAME": "postgres"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DJANGO_RAG={
            "EMBEDDER": embedder,
            "DASHBOARD": {"MAX_UPLOAD_BYTES": 50 * 1024 * 1024},
        },
    )
    django.setup()
    from django.db import connection, connections
    from django.urls import include, path

    class Urls:  # a URLconf made after setup (include() imports the views)
        urlpatterns = [path("rag/", include("django_rag.dashboard.urls"))]

    settings.ROOT_URLCONF = Urls

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
        if cursor.fetchone() is None:
            cursor.execute(f'CREATE DATABASE "{DATABASE}"')
    connections.close_all()
    settings.DATABASES["default"]["NAME"] = DATABASE
    connections["default"].settings_dict["NAME"] = DATABASE
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_mode(mode: str, data: bytes, filename: str, client) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import override_settings

    from django_rag import background
    from django_rag.models import Document, Job

    Document.objects.all().delete()  # chunks cascade
    config = {**settings.DJANGO_RAG, "BACKGROUND": mode}
    with override_settings(DJANGO_RAG=config):
        started = time.perf_counter()
        response = client.post(
            "/rag/documents/upload/",
            {"collection": "bench", "file": SimpleUploadedFile(filename, data)},
        )
        responded = time.perf_counter() - started
        assert response.status_code == 302, response.content[:500]
        job = Job.objects.filter(kind="ingest").latest("pk")
        stop = threading.Event()
        worker = None
        if mode == "worker":
            worker = threading.Thread(target=background.work, kwargs={"stop": stop})
            worker.start()
        while Job.objects.get(pk=job.pk).status not in ("completed", "failed"):
            time.sleep(0.05)
        completed = time.perf_counter() - started
        stop.set()
        if worker is not None:
            worker.join()
    job.refresh_from_db()
    return {
        "mode": mode,
        "response_s": responded,
        "completed_s": completed,
        "status": job.status,
        "chunks": job.result.get("chunk_count"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=PDF)
    parser.add_argument("--modes", default="inline,thread,worker")
    parser.add_argument("--embedder", default="sentence-transformers")
    args = parser.parse_args()
    configure(args.embedder)
    try:
        measure(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not os.environ.get("DATABASE_URL"):
            from django_rag.embedded import stop_embedded_server

            stop_embedded_server(DATA_DIR)


def measure(args) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from django_rag.embeddings import get_embedder

    get_embedder().embed_query("warm up")  # load the model before timing anything
    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True})
    client = Client()
    client.force_login(user)
    data = args.file.read_bytes()
    print(f"{args.file.name}: {len(data) / 1e6:.1f} MB, embedder {get_embedder().model_name}")
    print(f"load average: {open('/proc/loadavg').read().strip()}")
    print(f"{'mode':8} {'response':>10} {'completed':>10}  status     chunks")
    for mode in args.modes.split(","):
        r = run_mode(mode, data, args.file.name, client)
        print(
            f"{r['mode']:8} {r['response_s']:9.2f}s {r['completed_s']:9.2f}s  "
            f"{r['status']:10} {r['chunks']}"
        )
    print(f"load average: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()

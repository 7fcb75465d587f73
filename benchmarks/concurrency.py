"""Writers under contention and delete scaling, on the embedded PostgreSQL (or DATABASE_URL).

Runs in its own database (``django_rag_concurrency``) with the offline hashing embedder, so the
figures are the store's, not the model's:

1. delete time against document size (one document of N chunks, N doubling);
2. 8 threads replacing and deleting 10 overlapping identities for ``--seconds``: writes per
   second, errors surfaced (deadlocks included), statistics checked against a recount;
3. an ingest into another collection while a delete of a large document holds its
   transaction open: how long the ingest waits.

    python benchmarks/concurrency.py [--seconds 30] [--sizes 1000,2000,4000,8000]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

django.setup()

from django.test.utils import override_settings  # noqa: E402

# The store's figures, not the model's: the offline hashing embedder.
override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}).enable()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.exceptions import DocumentNotFound  # noqa: E402
from django_rag.models import Document  # noqa: E402
from django_rag.store import delete_documents, recount_statistics  # noqa: E402

WORDS = "refund parcel harbour station ledger invoice courier warranty voucher tariff".split()
DATABASE = "django_rag_concurrency"


def use_own_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE DATABASE {DATABASE}")
    connections.close_all()
    settings.DATABASES["default"]["NAME"] = DATABASE
    connections["default"].settings_dict["NAME"] = DATABASE
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_rag_document, django_rag_collection, django_rag_term, "
            "django_rag_term_delta, django_rag_corpus, django_rag_corpus_delta CASCADE"
        )


def document_of(chunks: int, collection: str) -> Document:
    lines = "\n\n".join(f"Ledger line {i} about tariffs and vouchers." for i in range(chunks))
    return rag.ingest(lines, collection=collection, chunk_size=12, chunk_overlap=0)


def delete_scaling(sizes: list[int]) -> None:
    print("delete time by document size")
    for size in sizes:
        document = document_of(size, f"scale-{size}")
        start = time.perf_counter()
        rag.delete(document)
        print(f"  {document.chunk_count:>6} chunks: {time.perf_counter() - start:6.2f} s")


def contention(seconds: float) -> None:
    identities = [f"id-{i}" for i in range(10)]
    deadline = time.monotonic() + seconds
    counts = {"writes": 0, "deletes": 0, "errors": 0}
    lock = threading.Lock()
    errors = []

    def writer(index: int) -> None:
        rng = random.Random(index)
        try:
            while time.monotonic() < deadline:
                identity = rng.choice(identities)
                try:
                    if rng.random() < 0.75:
                        text = "\n\n".join(
                            " ".join(rng.choice(WORDS) for _ in range(12))
                            for _ in range(rng.randint(2, 30))
                        )
                        rag.ingest(text, collection="contention", source_id=identity, replace=True)
                        key = "writes"
                    else:
                        found = Document.objects.filter(source_id=identity).values_list(
                            "pk", flat=True
                        )[:1]
                        try:
                            rag.delete(found[0] if found else -1)
                        except DocumentNotFound:
                            pass
                        key = "deletes"
                except Exception as exc:  # counted: the figure to report is 0
                    key = "errors"
                    errors.append(exc)
                with lock:
                    counts[key] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statistics = recount_statistics()
    exact = statistics["stored"] == statistics["recount"]
    print(
        f"8 writers, {seconds:.0f} s: {counts['writes']} replaces, {counts['deletes']} deletes "
        f"({(counts['writes'] + counts['deletes']) / seconds:.1f} operations/s), "
        f"{counts['errors']} errors, statistics equal to a recount: {exact}"
    )
    for exc in errors[:3]:
        print(f"  {type(exc).__name__}: {exc}")


def open_delete_versus_ingest(size: int) -> None:
    big = document_of(size, "big")
    deleted, done = threading.Event(), threading.Event()
    waited = {}

    def hold() -> None:
        try:
            with transaction.atomic():
                delete_documents([big.pk])
                deleted.set()
                done.wait(60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    deleted.wait(60)
    start = time.perf_counter()
    rag.ingest("Tariffs on vouchers changed.", collection="elsewhere")
    waited["ingest"] = time.perf_counter() - start
    done.set()
    holder.join()
    print(
        f"ingest into another collection while a {big.chunk_count}-chunk delete holds its "
        f"transaction: {waited['ingest'] * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--sizes", default="1000,2000,4000,8000")
    args = parser.parse_args()
    use_own_database()
    delete_scaling([int(size) for size in args.sizes.split(",")])
    contention(args.seconds)
    open_delete_versus_ingest(2000)


if __name__ == "__main__":
    main()

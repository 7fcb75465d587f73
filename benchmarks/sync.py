"""Model sync throughput: ``rag_sync`` backfilling rows against ``ingest_many`` on the same
texts, and a re-sync of unchanged rows.

In one run, with ``--rows`` rows of the test app's ``Note`` model (registered with
``@django_rag.indexed(text=["body"], collection="notes", format="markdown")``), their bodies
BEIR SciFact passages:

1. ``ingest_many`` on the rows' texts (``source_id`` = the row's identity, ``replace=True``,
   Markdown), timed; then the documents are deleted;
2. ``rag_sync`` (``django_rag.sync.reconcile``) backfilling the same rows, timed; the target is
   at least 0.9 x the ``ingest_many`` rate;
3. ``rag_sync`` again with nothing changed, timed: no embedding and no writes; the target is at
   least 2,000 rows/s.

The embedder is the deterministic hashing embedder (``django_rag.testing``) so that what is
compared is the sync's own overhead (reading rows, hashing, diffing, batching); with a real
model both paths spend the same embedding time on top.

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_sync python benchmarks/sync.py --rows 10000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.sync_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag import sync  # noqa: E402
from django_rag.models import Document  # noqa: E402
from tests.syncapp.models import Note  # noqa: E402


def passages(data: Path, count: int) -> list[str]:
    texts = []
    with (data / "corpus.jsonl").open() as corpus:
        for line in corpus:
            doc = json.loads(line)
            texts.append(f"# {doc['title']}\n\n{doc['text']}".strip())
            if len(texts) == count:
                break
    while len(texts) < count:  # more rows than passages: numbered copies
        texts.append(f"{texts[len(texts) % len(texts)]}\n\nCopy {len(texts)}.")
    return texts


def empty_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_rag_chunk, django_rag_document, django_rag_sourceversion, "
            "django_rag_job CASCADE"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/scifact")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    empty_index()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE syncapp_note")
    texts = passages(args.data, args.rows)
    # bulk_create sends no signals: the rows exist, nothing is indexed yet.
    Note.objects.bulk_create([Note(body=text) for text in texts], batch_size=1000)
    rows = list(Note.objects.order_by("pk").values_list("pk", "body"))
    figures = {"rows": len(rows)}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        items = [
            {"text": body, "source_id": f"syncapp.note:{pk}", "format": "markdown"}
            for pk, body in rows
        ]
        started = time.perf_counter()
        rag.ingest_many(items, collection="notes", replace=True)
        figures["ingest_many_s"] = time.perf_counter() - started
        documents = Document.objects.filter(collection__name="notes").count()
        empty_index()

        started = time.perf_counter()
        (report,) = sync.reconcile("syncapp.Note")
        figures["rag_sync_s"] = time.perf_counter() - started
        assert report.added == len(rows) and not report.failed, report
        assert Document.objects.filter(collection__name="notes").count() == documents

        started = time.perf_counter()
        (again,) = sync.reconcile("syncapp.Note")
        figures["resync_s"] = time.perf_counter() - started
        assert again.unchanged == len(rows) and again.added == again.replaced == 0, again
    figures["ingest_many_rows_per_s"] = len(rows) / figures["ingest_many_s"]
    figures["rag_sync_rows_per_s"] = len(rows) / figures["rag_sync_s"]
    figures["rag_sync_vs_ingest_many"] = figures["ingest_many_s"] / figures["rag_sync_s"]
    figures["resync_rows_per_s"] = len(rows) / figures["resync_s"]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()

"""Semantic search overhead: ``rag.search(mode="semantic")`` against the raw pgvector query.

In one run, on the same rows and the same query vectors (embedding excluded: the vectors are
precomputed), it times

- the raw query with psycopg (no ORM): ``SET hnsw.ef_search`` once, then
  ``SELECT id FROM django_rag_chunk ORDER BY embedding <=> %s LIMIT k``; scoped, the exact scan
  over the collection's rows (``ORDER BY (embedding <=> %s) + 0``, what a small filter needs);
- ``rag.search(mode="semantic")``, unscoped and scoped to a collection of ~1% of the chunks;

and prints p50 / p95 after a warm-up, plus the SQL statements one search sends.

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_semantic \\
        python benchmarks/semantic_latency.py --chunks 13000,100000 --queries 300

The rows are synthetic (random unit vectors near a few hundred centres, 384 dimensions, short
texts), added through the ORM and ``index_chunks`` up to each size; an existing database is
reused and topped up. It uses benchmarks/settings.py (the embedded server in
``DJANGO_RAG_BENCHMARK_DB``, else ``$TMP/django_rag_benchmarks``, or ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conf import embedding_dimensions, search_setting  # noqa: E402
from django_rag.embeddings import Embedder  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.managers import pgvector_version  # noqa: E402
from django_rag.store.statistics import index_chunks  # noqa: E402

WORDS = (
    "protein cell gene tumour receptor dose trial cohort signal enzyme membrane virus "
    "antibody pathway mutation insulin neuron plasma kinase therapy"
).split()
CENTRES = 300
SMALL = "one-percent"


class Precomputed(Embedder):
    """Returns the query's precomputed vector (the benchmark's queries are their own keys)."""

    model_name = "precomputed"

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def embed_query(self, text):
        return self.vectors[text]


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def fill_to(target: int, centres: np.ndarray, rng: np.random.Generator) -> None:
    """Add synthetic chunks up to ``target``; 1% of every batch goes to the small collection."""
    big, _ = Collection.objects.get_or_create(name="synthetic")
    small, _ = Collection.objects.get_or_create(name=SMALL)
    current = Chunk.objects.count()
    batch = 5000
    while current < target:
        n = min(batch, target - current)
        n_small = max(1, n // 100)
        for collection, count in ((small, n_small), (big, n - n_small)):
            document = Document.objects.create(
                collection=collection,
                source_id=f"synthetic-{current}-{collection.name}",
                content="synthetic",
                content_hash=f"{current}-{collection.name}",
                status=Document.Status.COMPLETED,
                chunk_count=count,
            )
            picks = rng.integers(0, len(centres), count)
            vectors = unit(centres[picks] + rng.normal(0, 0.04, (count, centres.shape[1])))
            rows = []
            for i in range(count):
                words = [WORDS[j] for j in rng.integers(0, len(WORDS), 12)]
                rows.append(
                    Chunk(
                        document=document,
                        collection=collection,
                        chunk_index=i,
                        text=" ".join(words),
                        token_count=len(words),
                        embedding=vectors[i].tolist(),
                        embedding_model="synthetic",
                    )
                )
            Chunk.objects.bulk_create(rows, batch_size=1000)
            index_chunks(document_id=document.pk)
        current += n
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def timed(func, items, warmup: int) -> list[float]:
    for item in items[:warmup]:
        func(item)
    timings = []
    for item in items:
        start = time.perf_counter()
        func(item)
        timings.append((time.perf_counter() - start) * 1000)
    return timings


def literal(vector) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="13000", help="sizes, e.g. 13000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    dims = embedding_dimensions()
    rng = np.random.default_rng(7)
    centres = unit(rng.normal(size=(CENTRES, dims)))
    picks = rng.integers(0, CENTRES, args.queries)
    query_vectors = unit(centres[picks] + rng.normal(0, 0.05, (args.queries, dims)))
    queries = {f"q{i}": v.tolist() for i, v in enumerate(query_vectors)}
    names = list(queries)
    embedder = Precomputed(queries)
    ef = int(search_setting("HNSW_EF_SEARCH"))
    limit = args.limit

    texts = {name: literal(vector) for name, vector in queries.items()}
    raw = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    raw.execute(f"SET hnsw.ef_search = {max(ef, limit)}")

    print(
        f"pgvector {'.'.join(map(str, pgvector_version()))}, {dims} dimensions, limit {limit}, "
        f"HNSW_EF_SEARCH {ef}, {args.queries} queries after {args.warmup} warm-up; p50 / p95 ms\n"
    )
    print(
        "| chunks | raw HNSW | `search` unscoped | raw exact, 1% collection | `search` scoped to 1% |"
    )
    print("|---|---|---|---|---|")
    for target in [int(x) for x in args.chunks.split(",")]:
        fill_to(target, centres, rng)
        total = Chunk.objects.count()
        small_id = Collection.objects.get(name=SMALL).pk

        def raw_unscoped(name):
            raw.execute(
                "SELECT id FROM django_rag_chunk ORDER BY embedding <=> %s::vector LIMIT %s",
                [texts[name], limit],
            ).fetchall()

        def raw_scoped(name, small_id=small_id):
            raw.execute(
                "SELECT id FROM django_rag_chunk WHERE collection_id = %s "
                "ORDER BY (embedding <=> %s::vector) + 0 LIMIT %s",
                [small_id, texts[name], limit],
            ).fetchall()

        def ours(name, collection=None):
            results = rag.search(
                name, mode="semantic", limit=limit, embedder=embedder, collection=collection
            )
            assert len(results) == limit, len(results)

        cells = [
            timed(raw_unscoped, names, args.warmup),
            timed(ours, names, args.warmup),
            timed(raw_scoped, names, args.warmup),
            timed(lambda name: ours(name, SMALL), names, args.warmup),
        ]
        print(
            f"| {total} | "
            + " | ".join(f"{percentile(t, 50):.2f} / {percentile(t, 95):.2f}" for t in cells)
            + " |"
        )
        for label, collection in (("unscoped", None), ("scoped", SMALL)):
            with CaptureQueriesContext(connection) as captured:
                ours(names[0], collection)
            statements = [" ".join(q["sql"].split())[:90] for q in captured.captured_queries]
            print(f"\n  {label}: {len(statements)} SQL statements")
            for sql in statements:
                print(f"    {sql}")
        print()
    raw.close()
    print(f"Load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Hybrid overhead: ``rag.search`` per mode on SciFact, and the statements one search sends.

Runs the first ``--queries`` SciFact test queries in each mode (semantic, fulltext, hybrid;
limit 10, the query vectors precomputed so that embedding is excluded): one warm-up pass, then
``--repeat`` timed passes, and prints p50 / p95 in ms; then counts the SQL statements of 20
searches under the Django debug cursor and prints the statements that cost the most (ms per
search, as the debug cursor times them: round trip included).

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_benchmarks python benchmarks/hybrid_overhead.py

The database must hold the SciFact corpus (``benchmarks/beir.py`` ingests it). On a server with
pg_textsearch and its index (see ``benchmarks/fulltext_backends.py``) the ``"auto"`` backend
ranks with the index. It uses benchmarks/settings.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import CachedQueries, load  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.models.textsearch import fulltext_backend  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/work/shared/data/scifact")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--modes", default="semantic,fulltext,hybrid")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    _, queries, _ = load(Path(args.data), "test")
    texts = list(queries.values())[: args.queries]
    embedder = get_embedder()
    cached = CachedQueries(embedder, {q: embedder.embed_query(q) for q in texts})
    print(f"full-text backend: {fulltext_backend()}, {len(texts)} queries x {args.repeat}")
    for mode in args.modes.split(","):
        for q in texts:
            rag.search(q, mode=mode, limit=10, embedder=cached)
        times = []
        for _ in range(args.repeat):
            for q in texts:
                start = time.perf_counter()
                rag.search(q, mode=mode, limit=10, embedder=cached)
                times.append((time.perf_counter() - start) * 1000)
        times.sort()
        p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95)]
        with CaptureQueriesContext(connection) as captured:
            for q in texts[:20]:
                rag.search(q, mode=mode, limit=10, embedder=cached)
        n = min(20, len(texts))
        print(
            f"{mode}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
            f"{len(captured.captured_queries) / n:.2f} statements per search"
        )
        cost: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for query in captured.captured_queries:
            key = " ".join(query["sql"].split())[:60]
            cost[key][0] += 1
            cost[key][1] += float(query["time"]) * 1000
        for key, (count, ms) in sorted(cost.items(), key=lambda kv: -kv[1][1])[:6]:
            print(f"    {count / n:.2f} x {ms / n:.2f} ms  {key}")


if __name__ == "__main__":
    main()

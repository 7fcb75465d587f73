"""Threshold rounds against widening: what the SQL backend's full-text search scores and how long
it takes, per SciFact test question, with and without the threshold round (docs/search.md,
"Full-text"). Both run in the same process, question by question (the two alternate, so load
on the machine weighs on both alike); the chunks scored per search (the sum over its rounds of
the chunks each round's tsquery matches) do not depend on the load.

    DJANGO_RAG_BENCHMARK_DB=/tmp/bench_100k python benchmarks/threshold_rounds.py --queries 100

Needs a benchmark database holding the SciFact corpus (``benchmarks/beir.py``), padded or not
(``benchmarks/million.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from benchmarks.beir import load  # noqa: E402
from django_rag.models import Chunk, bm25, fulltext_search  # noqa: E402
from django_rag.models.fulltext_search import FulltextSearch  # noqa: E402


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--nodes", type=int, help="bm25.THRESHOLD_QUERY_NODES for this run")
    args = parser.parse_args()
    if args.nodes:
        bm25.THRESHOLD_QUERY_NODES = args.nodes
    _, queries, _ = load(Path(args.data), "test")
    questions = list(queries.values())[: args.queries]

    rounds: list[str] = []
    matching = FulltextSearch.matching

    def recording(self, tsquery):
        rounds.append(tsquery)
        return matching(self, tsquery)

    FulltextSearch.matching = recording
    threshold_query = fulltext_search.threshold_query
    variants = {"widening": lambda weights, need: None, "threshold": threshold_query}
    timings = {name: [] for name in variants}
    scored = {name: [] for name in variants}
    agree = 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_rag_chunk")
        chunks = cursor.fetchone()[0]
    for question in questions:
        ranked = {}
        for name, variant in variants.items():
            fulltext_search.threshold_query = variant
            Chunk.objects.fulltext_hits(question, limit=args.limit)  # warm
            rounds.clear()
            begin = time.perf_counter()
            ranked[name] = Chunk.objects.fulltext_hits(question, limit=args.limit)
            timings[name].append((time.perf_counter() - begin) * 1000)
            with connection.cursor() as cursor:
                total = 0
                for tsquery in rounds:
                    cursor.execute(
                        "SELECT count(*) FROM django_rag_chunk WHERE search_vector @@ %s::tsquery",
                        [tsquery],
                    )
                    total += cursor.fetchone()[0]
            scored[name].append(total)
        agree += [pk for pk, _ in ranked["widening"]] == [pk for pk, _ in ranked["threshold"]]
    fulltext_search.threshold_query = threshold_query
    with open("/proc/loadavg") as f:
        load_average = f.read().split()[0]
    print(
        f"{chunks:,} chunks, {len(questions)} questions, limit {args.limit}, "
        f"threshold query nodes {bm25.THRESHOLD_QUERY_NODES}, load average {load_average} at the end"
    )
    print("| rounds | p50 / p95 ms | chunks scored: median / p95 / max |")
    print("|---|---|---|")
    for name in variants:
        t, s = timings[name], scored[name]
        print(
            f"| {name} | {statistics.median(t):.1f} / {percentile(t, 95):.1f} | "
            f"{statistics.median(s):,.0f} / {percentile(s, 95):,.0f} / {max(s):,} |"
        )
    print(f"same top {args.limit} (ids, in order): {agree} of {len(questions)}")


if __name__ == "__main__":
    main()

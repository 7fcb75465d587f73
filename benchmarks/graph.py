"""GraphRAG measurements on SciFact (docs/benchmarks.md):

1. graph build overhead with a local extractor that needs no LLM (capitalised phrases +
   co-occurrence): chunks/s, and the share of the time spent in the extractor vs ours
   (entity embeddings, persistence);
2. Leiden on a synthetic graph of 10k entities and 50k relationships;
3. nDCG@10 of hybrid vs hybrid + graph (depth 0 and 1) on a sample of the corpus.

    python benchmarks/graph.py [--data ../shared/data/scifact] [--sample-docs 600]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import load, metrics, passage  # noqa: E402
from django_rag.graph import build_graph  # noqa: E402
from django_rag.graph import extractors as graph_extractors  # noqa: E402
from django_rag.graph.communities import leiden_levels  # noqa: E402
from django_rag.models import Chunk, Collection  # noqa: E402

COLLECTION = "graph-sample"


class Timed(graph_extractors.CapitalizedEntityExtractor):
    seconds = 0.0

    def extract(self, text):
        start = time.perf_counter()
        try:
            return super().extract(text)
        finally:
            type(self).seconds += time.perf_counter() - start


class TimedCooccurrence(graph_extractors.CooccurrenceRelationshipExtractor):
    def extract(self, text, entities):
        start = time.perf_counter()
        try:
            return super().extract(text, entities)
        finally:
            Timed.seconds += time.perf_counter() - start


def sample(corpus, queries, qrels, size, rng):
    """Every judged document of the test queries, plus random others up to ``size``."""
    judged = {doc for rel in qrels.values() for doc in rel}
    by_id = {doc["_id"]: doc for doc in corpus}
    chosen = [by_id[d] for d in sorted(judged) if d in by_id]
    others = [doc for doc in corpus if doc["_id"] not in judged]
    chosen += rng.sample(others, max(0, size - len(chosen)))
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--sample-docs", type=int, default=600)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    corpus, queries, qrels = load(Path(args.data), "test")
    docs = sample(corpus, queries, qrels, args.sample_docs, rng)
    if not Collection.objects.filter(name=COLLECTION).exists():
        rag.ingest_many(
            [{"text": passage(d), "source_id": d["_id"], "title": d["title"]} for d in docs],
            collection=COLLECTION,
        )
    chunks = Chunk.objects.filter(collection__name=COLLECTION).count()

    # 1. Build overhead.
    start = time.perf_counter()
    totals = build_graph(
        COLLECTION, resume=False, entity_extractor=Timed(),
        relationship_extractor=TimedCooccurrence(max_entities=12), extractor=None,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    print(
        f"build: {chunks} chunks, {totals['entities']} entity findings, "
        f"{totals['relationships']} relationship findings in {seconds:.1f} s "
        f"= {chunks / seconds:.1f} chunks/s; extractor {Timed.seconds:.1f} s "
        f"({100 * Timed.seconds / seconds:.0f}%), ours {seconds - Timed.seconds:.1f} s "
        f"({100 * (seconds - Timed.seconds) / seconds:.0f}%)"
    )

    # 2. Leiden on 10k entities / 50k relationships (200 planted groups of 50).
    edges = set()
    while len(edges) < 50_000:
        group = rng.randrange(200)
        if rng.random() < 0.9:
            a, b = rng.sample(range(group * 50, group * 50 + 50), 2)
        else:
            a, b = rng.sample(range(10_000), 2)
        edges.add((min(a, b), max(a, b), 1.0))
    edges = sorted(edges)
    start = time.perf_counter()
    partitions = leiden_levels(edges, resolution=1.0, levels=1, max_cluster_size=1000, seed=42)
    print(
        f"leiden: 10,000 entities, {len(edges):,} relationships: "
        f"{time.perf_counter() - start:.2f} s, {len(partitions[0])} communities"
    )

    # 3. Quality on the sample: hybrid vs hybrid + graph.
    judged_queries = {q: t for q, t in queries.items() if set(qrels[q]) & {d["_id"] for d in docs}}
    for label, options in [
        ("hybrid", {}),
        ("hybrid+graph depth 0", {"graph": True, "graph_depth": 0}),
        ("hybrid+graph depth 1", {"graph": True, "graph_depth": 1}),
    ]:
        scores, timings = [], []
        for qid, text in judged_queries.items():
            begin = time.perf_counter()
            hits = rag.search(text, collection=COLLECTION, mode="hybrid", limit=100, **options)
            timings.append(time.perf_counter() - begin)
            ranked = list(dict.fromkeys(h.source_id for h in hits))
            scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
        print(
            f"{label}: nDCG@10 {statistics.mean(scores):.4f} over {len(scores)} queries, "
            f"p50 {1000 * statistics.median(timings):.1f} ms"
        )


if __name__ == "__main__":
    main()

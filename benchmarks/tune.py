"""Sweep search options on a corpus stored by benchmarks/beir.py (run that first).

    python benchmarks/tune.py --split train                       # the hybrid defaults' sweep
    python benchmarks/tune.py --split test '{"mode": "semantic"}' --ef-search 40

Each argument is a JSON dict of rag.search options; nDCG@10 and p50 latency (including the
query embedding, limit 30) are printed for each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir import ROOT, load, metrics  # noqa: E402  (sets up Django)
from django.conf import settings  # noqa: E402

import django_rag as rag  # noqa: E402

SWEEP = [
    {"mode": "semantic"},
    {"mode": "fulltext"},
    {
        "mode": "hybrid",
        "fusion": "weighted",
        "semantic_weight": 0.5,
        "fulltext_weight": 0.5,
        "candidates": 2,
    },
    {
        "mode": "hybrid",
        "fusion": "weighted",
        "semantic_weight": 0.6,
        "fulltext_weight": 0.4,
        "candidates": 2,
    },
    {
        "mode": "hybrid",
        "fusion": "weighted",
        "semantic_weight": 0.4,
        "fulltext_weight": 0.6,
        "candidates": 2,
    },
    {
        "mode": "hybrid",
        "fusion": "weighted",
        "semantic_weight": 0.5,
        "fulltext_weight": 0.5,
        "candidates": 4,
    },
    {"mode": "hybrid", "fusion": "rrf", "candidates": 2},
]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*", type=json.loads)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="train")
    parser.add_argument("--ef-search", type=int, default=None)
    args = parser.parse_args()
    if args.ef_search:
        settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"HNSW_EF_SEARCH": args.ef_search}}
    _, queries, qrels = load(args.data, args.split)
    print(f"{args.split} queries: {len(queries)}")
    for options in args.configs or SWEEP:
        scores, timings = [], []
        for qid, text in queries.items():
            start = time.perf_counter()
            results = rag.search(text, collection="corpus", limit=30, **options)
            timings.append((time.perf_counter() - start) * 1000)
            ranked = list(dict.fromkeys(r.source_id for r in results))
            scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
        print(
            f"{json.dumps(options)}: nDCG@10 {statistics.mean(scores):.4f}, p50 {statistics.median(timings):.1f} ms"
        )


if __name__ == "__main__":
    main()

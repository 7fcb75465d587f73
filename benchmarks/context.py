"""Chunk headers and the context window, measured (issue 27 item 5).

    python benchmarks/context.py                       # SciFact train+test and HotpotQA dev200
    python benchmarks/context.py --skip-scifact        # HotpotQA only (a few minutes)
    python benchmarks/context.py --reuse               # search what a previous run stored

1. Chunk headers (``CHUNK_HEADERS``): retrieval nDCG@10 per mode with the documents' text
   ingested as it is, with headers off and on (the title is the document's title; these corpora
   have no Markdown headings, so the header is the title), and, for reference, with the title
   written into the text (what benchmarks/beir.py does). SciFact train is the split to decide
   on; test is reported untuned. HotpotQA dev200 (its 1,947 paragraphs, 200 questions).
2. Context window: HotpotQA's paragraphs cut into small chunks (``--window-chunk-size``
   tokens, no overlap) so that a paragraph is several chunks; hybrid search, top
   ``--window-limit`` results, ``context_window`` 0, 1 and 2. Reported: how often the gold
   answer string is inside the returned text of a gold paragraph (and of any result), the
   results and characters returned per query, and the search time (under load).

A private embedded database (``DJANGO_RAG_BENCHMARK_DB``, default a directory of its own under
the temp dir) is wiped unless ``--reuse`` is given. Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# A server of its own: other benchmarks wipe theirs.
os.environ.setdefault(
    "DJANGO_RAG_BENCHMARK_DB", str(Path(tempfile.gettempdir()) / "django_rag_bench_context")
)

from django.core.management import call_command  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import (  # noqa: E402 (sets Django up)
    CachedQueries,
    load,
    metrics,
    ms,
    percentile,
)
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, paired_difference  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402

MODES = ("semantic", "fulltext", "hybrid")
VARIANTS = {
    # name: (text of a document, CHUNK_HEADERS)
    "text only": (lambda doc: doc["text"], False),
    "text + header": (lambda doc: doc["text"], True),
    "title in text": (lambda doc: f"{doc['title']}\n\n{doc['text']}".strip(), False),
}


def wipe() -> None:
    Chunk.objects.all().delete()
    Document.objects.all().delete()
    Collection.objects.all().delete()


def collection_name(dataset: str, variant: str) -> str:
    return f"{dataset}-{variant.replace(' ', '-').replace('+', 'plus')}"


def ingest(corpus, name: str, text, headers: bool, **options) -> float:
    """Ingest ``corpus`` into ``name`` (unless already there); returns the seconds it took."""
    if Document.objects.filter(collection__name=name).count() == len(corpus):
        return 0.0
    Document.objects.filter(collection__name=name).delete()
    start = time.perf_counter()
    with override_settings(DJANGO_RAG={"CHUNK_HEADERS": headers}):
        rag.ingest_many(
            (
                {"text": text(doc), "source_id": doc["_id"], "title": doc["title"]}
                for doc in corpus
                if text(doc).strip()
            ),
            collection=name,
            **options,
        )
    return time.perf_counter() - start


def ranked_ndcg(queries, qrels, cached, collection, mode) -> list[float]:
    scores = []
    for qid, text in queries.items():
        results = rag.search(text, collection=collection, limit=100, mode=mode, embedder=cached)
        ranked = list(dict.fromkeys(r.source_id for r in results))
        scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
    return scores


def header_report(title: str, corpus, splits, embedder, dataset: str, variants=None) -> None:
    variants = {name: VARIANTS[name] for name in (variants or VARIANTS)}
    print(f"\n### {title}: nDCG@10 with and without chunk headers\n")
    seconds = {}
    for variant, (text, headers) in variants.items():
        seconds[variant] = ingest(corpus, collection_name(dataset, variant), text, headers)
        chunks = Chunk.objects.filter(collection__name=collection_name(dataset, variant)).count()
        print(
            f"- {variant}: {chunks:,} chunks"
            + (f", ingested in {seconds[variant]:.0f} s" if seconds[variant] else "")
        )
    print()
    print(f"| split | mode | {' | '.join(variants)} | header − text only (95% CI) |")
    print("|---|---|" + "---|" * len(variants) + "---|")
    for split, (queries, qrels) in splits.items():
        vectors = {text: embedder.embed_query(text) for text in queries.values()}
        cached = CachedQueries(embedder, vectors)
        for mode in MODES:
            per_variant = {
                variant: ranked_ndcg(
                    queries, qrels, cached, collection_name(dataset, variant), mode
                )
                for variant in variants
            }
            delta, low, high = paired_difference(
                per_variant["text only"], per_variant["text + header"]
            )
            cells = " | ".join(f"{statistics.mean(values):.3f}" for values in per_variant.values())
            print(
                f"| {split} ({len(queries)} q) | {mode} | {cells} | "
                f"{delta:+.3f} ({low:+.3f} to {high:+.3f}) |"
            )


def sample(corpus, qrels, size: int):
    """Every judged document of ``qrels`` and random others (seeded) up to ``size`` (0: all)."""
    if not size or size >= len(corpus):
        return corpus
    judged = {doc for split in qrels for relevant in split.values() for doc in relevant}
    kept = [doc for doc in corpus if doc["_id"] in judged]
    others = [doc for doc in corpus if doc["_id"] not in judged]
    kept += random.Random(13).sample(others, max(0, size - len(kept)))
    return kept


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def window_report(corpus, queries, qrels, answers, embedder, chunk_size: int, base: int):
    name = f"hotpot-small-{chunk_size}"
    seconds = ingest(
        corpus,
        name,
        VARIANTS["text only"][0],
        False,
        chunk_size=chunk_size,
        chunk_overlap=0,
    )
    chunks = Chunk.objects.filter(collection__name=name).count()
    documents = Document.objects.filter(collection__name=name).count()
    # Questions whose answer is a string to look for (yes/no answers are never in the text).
    asked = {
        qid: [normalise(a).strip(" .") for a in answers[qid]]
        for qid in queries
        if not {normalise(a).strip(" .") for a in answers[qid]} & {"yes", "no"}
    }
    vectors = {queries[qid]: embedder.embed_query(queries[qid]) for qid in asked}
    cached = CachedQueries(embedder, vectors)
    print(f"\n### Context window: HotpotQA dev200, paragraphs cut into {chunk_size}-token chunks\n")
    print(
        f"{documents:,} paragraphs in {chunks:,} chunks ({chunks / documents:.1f} per paragraph)"
        + (f", ingested in {seconds:.0f} s" if seconds else "")
        + f"; {len(asked)} questions with a string answer (yes/no left out); hybrid search.\n"
    )
    print(
        "| context_window | limit | answer in a gold paragraph's returned text | answer in any "
        "returned text | results per query | characters per query | p50 ms (under load) |"
    )
    print("|---|---|---|---|---|---|---|")
    # The window against more hits for the same characters: 2 and 3 times the limit, no window.
    for window, limit in ((0, base), (1, base), (2, base), (0, 2 * base), (0, 3 * base)):
        gold_found, any_found, counts, sizes, timings = [], [], [], [], []
        for qid, wanted in asked.items():
            start = time.perf_counter()
            results = rag.search(
                queries[qid],
                collection=name,
                limit=limit,
                mode="hybrid",
                context_window=window,
                embedder=cached,
            )
            timings.append(ms(time.perf_counter() - start))
            passages = [(r.source_id, normalise(r.passage)) for r in results]
            gold = set(qrels[qid])
            gold_found.append(
                float(any(a in p for source, p in passages if source in gold for a in wanted))
            )
            any_found.append(float(any(a in p for _, p in passages for a in wanted)))
            counts.append(len(results))
            sizes.append(sum(len(r.passage) for r in results))
        mean, low, high = bootstrap_interval(gold_found)
        print(
            f"| {window} | {limit} | {mean:.3f} ({low:.3f}-{high:.3f}) "
            f"| {statistics.mean(any_found):.3f} "
            f"| {statistics.mean(counts):.2f} | {statistics.mean(sizes):,.0f} "
            f"| {percentile(timings, 50):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = ROOT.parent / "shared" / "data"
    parser.add_argument("--scifact", type=Path, default=data / "scifact")
    parser.add_argument("--hotpot", type=Path, default=data / "hotpotqa_dev200")
    parser.add_argument("--skip-scifact", action="store_true")
    parser.add_argument("--skip-hotpot", action="store_true")
    parser.add_argument("--skip-headers", action="store_true", help="HotpotQA: the window only")
    parser.add_argument("--skip-window", action="store_true", help="HotpotQA: the headers only")
    parser.add_argument(
        "--scifact-docs",
        type=int,
        default=1000,
        help="SciFact documents ingested: every judged one (train and test) and random others "
        "up to this many (0: the whole corpus, 5,183)",
    )
    parser.add_argument(
        "--title-in-text",
        action="store_true",
        help="also the variant with the title written into the text (beir.py's)",
    )
    parser.add_argument("--reuse", action="store_true", help="keep what a previous run stored")
    parser.add_argument("--window-chunk-size", type=int, default=32)
    parser.add_argument("--window-limit", type=int, default=5)
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    if not args.reuse:
        wipe()
    embedder = get_embedder()
    embedder.embed_query("warm up")
    print(f"Embedder: {embedder.model_name}. Timings under load (shared 2-core machine).")

    variants = ["text only", "text + header"] + (["title in text"] * args.title_in_text)
    if not args.skip_hotpot:
        corpus, hotpot_queries, hotpot_qrels = load(args.hotpot, "test")
        answers = {
            q["_id"]: q["metadata"]["answers"]
            for q in map(json.loads, (args.hotpot / "queries.jsonl").open())
        }
        if not args.skip_window:
            window_report(
                corpus,
                hotpot_queries,
                hotpot_qrels,
                answers,
                embedder,
                args.window_chunk_size,
                args.window_limit,
            )
        if not args.skip_headers:
            header_report(
                "HotpotQA dev200",
                corpus,
                {"dev200": (hotpot_queries, hotpot_qrels)},
                embedder,
                "hotpot",
                variants,
            )
    if not args.skip_scifact:
        scifact, train_queries, train_qrels = load(args.scifact, "train")
        _, test_queries, test_qrels = load(args.scifact, "test")
        scifact = sample(scifact, [train_qrels, test_qrels], args.scifact_docs)
        header_report(
            f"SciFact ({len(scifact):,} documents: every judged one and random others)",
            scifact,
            {"train": (train_queries, train_qrels), "test": (test_queries, test_qrels)},
            embedder,
            "scifact",
            variants,
        )


if __name__ == "__main__":
    main()

"""BEIR benchmark: quality and latency per search mode, ingest throughput, filtered completeness,
and latency as the corpus grows.

    python benchmarks/beir.py                          # SciFact from ../shared/data/scifact
    python benchmarks/beir.py --data PATH --split test # any BEIR-format dataset
    python benchmarks/beir.py --reuse                  # search the corpus a previous run stored
    python benchmarks/beir.py --reuse --scale 10000,100000

It uses a private database (benchmarks/settings.py; embedded pgserver unless DATABASE_URL is
set), wipes the django_rag tables in it unless --reuse is given, and prints a Markdown report.
"""

from __future__ import annotations

import argparse
import json
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

import numpy as np  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.embeddings import Embedder, get_embedder  # noqa: E402
from django_rag.evaluation.beir import corpus_document, read_qrels  # noqa: E402
from django_rag.evaluation.metrics import (  # noqa: E402
    bootstrap_interval,
    ndcg,
    paired_difference,
)
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.managers import pgvector_version  # noqa: E402
from django_rag.retrieval.fulltext import index_chunks  # noqa: E402

MODES = {
    "semantic": {"mode": "semantic"},
    "fulltext": {"mode": "fulltext"},
    "hybrid": {"mode": "hybrid"},
    # The fixed mix that was the default before adaptive fusion, and rank fusion.
    "hybrid (weighted 0.6/0.4)": {
        "mode": "hybrid",
        "fusion": "weighted",
        "semantic_weight": 0.6,
        "fulltext_weight": 0.4,
    },
    "hybrid (rrf)": {"mode": "hybrid", "fusion": "rrf"},
}


class CachedQueries(Embedder):
    """Returns precomputed query vectors, so search timings exclude the embedding."""

    def __init__(self, inner: Embedder, vectors: dict[str, list[float]]):
        self.inner, self.vectors, self.model_name = inner, vectors, inner.model_name

    def embed_query(self, text):
        return self.vectors[text]


def load(data: Path, split: str):
    corpus = [json.loads(line) for line in (data / "corpus.jsonl").open()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (data / "queries.jsonl").open())}
    # The library's reader: a header line is optional (a file without one keeps its first row).
    qrels = read_qrels(data / "qrels" / f"{split}.tsv")
    return corpus, {q: queries[q] for q in qrels if q in queries}, qrels


def metrics(ranked: list[str], relevant: dict[str, int]) -> dict[str, float]:
    first = next((i for i, d in enumerate(ranked[:10]) if d in relevant), None)
    return {
        "nDCG@10": ndcg(ranked, relevant, 10),
        "MRR@10": 1 / (first + 1) if first is not None else 0.0,
        "Recall@10": len(set(ranked[:10]) & set(relevant)) / len(relevant),
        "Recall@100": len(set(ranked[:100]) & set(relevant)) / len(relevant),
    }


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def ms(seconds: float) -> float:
    return seconds * 1000


def wipe():
    Chunk.objects.all().delete()
    Document.objects.all().delete()
    Collection.objects.all().delete()


def ingest_corpus(corpus, embedder, encoder_sample: int):
    start = time.perf_counter()
    rag.ingest_many(
        (corpus_document(doc) for doc in corpus),
        collection="corpus",
    )
    seconds = time.perf_counter() - start
    chunks = Chunk.objects.filter(collection__name="corpus").count()
    # The plain encoder on the same texts: the chunks ingest produced, batches of 32.
    texts = list(
        Chunk.objects.filter(collection__name="corpus")
        .order_by("?")
        .values_list("text", flat=True)[:encoder_sample]
    )
    model = embedder.model
    begin = time.perf_counter()
    model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    encoder_rate = len(texts) / (time.perf_counter() - begin)
    # Every 100th document again, in a collection holding about 1% of the chunks.
    for doc in corpus[::100]:
        rag.ingest(**corpus_document(doc), collection="one-percent")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {
        "seconds": seconds,
        "documents": len(corpus),
        "chunks": chunks,
        "encoder": encoder_rate,
        "sample": len(texts),
    }


def print_hybrid_against_parts(by_mode) -> None:
    """Hybrid minus the better of its parts, paired by query, with its bootstrap interval."""
    best = max(("semantic", "fulltext"), key=lambda name: by_mode[name]["nDCG@10"])
    for hybrid in (name for name in by_mode if name.startswith("hybrid")):
        delta, low, high = paired_difference(
            by_mode[best]["per_query_ndcg"], by_mode[hybrid]["per_query_ndcg"]
        )
        verdict = "better than" if low > 0 else "worse than" if high < 0 else "within noise of"
        print(
            f"\n{hybrid} - {best} (the better part), paired over {len(by_mode[best]['per_query_ndcg'])} "
            f"queries: nDCG@10 {delta:+.4f} (95% bootstrap interval {low:+.4f} .. {high:+.4f}): "
            f"{hybrid} is {verdict} {best}."
        )


def run_queries(queries, qrels, cached, options, collection, limit=100):
    per_query, timings = [], []
    for qid, text in queries.items():
        start = time.perf_counter()
        results = rag.search(text, collection=collection, limit=limit, embedder=cached, **options)
        timings.append(ms(time.perf_counter() - start))
        ranked = list(dict.fromkeys(r.source_id for r in results))
        per_query.append(metrics(ranked, qrels[qid]))
    summary = {k: statistics.mean(m[k] for m in per_query) for k in per_query[0]}
    summary["p50"], summary["p95"] = percentile(timings, 50), percentile(timings, 95)
    summary["per_query_ndcg"] = [m["nDCG@10"] for m in per_query]
    _, summary["low"], summary["high"] = bootstrap_interval(summary["per_query_ndcg"])
    return summary


def completeness(queries, cached, rng):
    """Rows returned for limit 10 on the 1% collection, against what exists, per mode."""
    small = Chunk.objects.filter(collection__name="one-percent")
    words = sorted(
        {
            w
            for text in small.values_list("text", flat=True)
            for w in text.split()
            if w.isalpha() and len(w) > 4
        }
    )
    report = {}
    for name, options in MODES.items():
        complete = total = 0
        for text in list(queries.values())[:50]:
            # Queries built from the collection's own words, so full-text has matches too.
            query = " ".join(rng.sample(words, 3)) if options["mode"] == "fulltext" else text
            if query not in cached.vectors:
                cached.vectors[query] = cached.inner.embed_query(query)
            results = rag.search(
                query, collection="one-percent", limit=10, embedder=cached, **options
            )
            if options["mode"] == "fulltext":
                from django_rag.retrieval.fulltext import parse_query

                expected = min(10, small.matching(parse_query(query).match).count())
            else:
                expected = min(10, small.count())
            complete += len(results) == expected and all(
                r.collection == "one-percent" for r in results
            )
            total += 1
        report[name] = (complete, total)
    return report


def pad_to(target: int, rng: random.Random):
    """Add synthetic chunks (shuffled words, perturbed vectors of real chunks) up to ``target``."""
    current = Chunk.objects.count()
    if current >= target:
        return
    collection, _ = Collection.objects.get_or_create(name="padding")
    source = list(
        Chunk.objects.filter(collection__name="corpus").values_list("text", "embedding")[:5000]
    )
    batch = 2000
    while current < target:
        n = min(batch, target - current)
        document = Document.objects.create(
            collection=collection,
            source_id=f"pad-{current}",
            content="padding",
            content_hash=str(current),
            status=Document.Status.COMPLETED,
            chunk_count=n,
        )
        rows = []
        for i in range(n):
            text, vector = source[rng.randrange(len(source))]
            words = text.split()
            rng.shuffle(words)
            noisy = np.asarray(vector) + np.random.default_rng(current + i).normal(
                0, 0.02, len(vector)
            )
            rows.append(
                Chunk(
                    document=document,
                    collection=collection,
                    chunk_index=i,
                    text=" ".join(words),
                    token_count=len(words),
                    embedding=(noisy / np.linalg.norm(noisy)).tolist(),
                    embedding_model="padding",
                )
            )
        Chunk.objects.bulk_create(rows, batch_size=500)
        index_chunks(document_id=document.pk)
        current += n
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def langchain_version() -> str:
    from importlib.metadata import version

    return version("langchain-postgres")


def langchain_semantic(queries, qrels, cached):
    """langchain-postgres' PGVector on the same chunks, vectors and server."""
    from django.conf import settings
    from langchain_core.embeddings import Embeddings
    from langchain_postgres import PGVector

    class Fixed(Embeddings):
        def embed_documents(self, texts):
            return cached.inner.embed_documents(texts)

        def embed_query(self, text):
            return cached.vectors[text]

    db = settings.DATABASES["default"]
    host = db["HOST"]
    if host.startswith("/"):  # a Unix socket directory (the embedded server)
        location = f"/{db['NAME']}?host={host}"
    else:
        location = f"{host}:{db['PORT'] or 5432}/{db['NAME']}"
    url = f"postgresql+psycopg://{db['USER']}:{db['PASSWORD']}@{location}"
    store = PGVector(
        embeddings=Fixed(),
        connection=url,
        collection_name="benchmark",
        embedding_length=len(next(iter(cached.vectors.values()))),
        pre_delete_collection=True,
        use_jsonb=True,
    )
    rows = list(
        Chunk.objects.filter(collection__name="corpus").values_list(
            "pk", "text", "embedding", "document__source_id"
        )
    )
    start = time.perf_counter()
    for i in range(0, len(rows), 1000):
        part = rows[i : i + 1000]
        store.add_embeddings(
            texts=[r[1] for r in part],
            embeddings=[list(map(float, r[2])) for r in part],
            metadatas=[{"source_id": r[3]} for r in part],
            ids=[str(r[0]) for r in part],
        )
    load_seconds = time.perf_counter() - start
    per_query, timings = [], []
    for qid, text in queries.items():
        begin = time.perf_counter()
        documents = store.similarity_search_by_vector(cached.vectors[text], k=100)
        timings.append(ms(time.perf_counter() - begin))
        ranked = list(dict.fromkeys(d.metadata["source_id"] for d in documents))
        per_query.append(metrics(ranked, qrels[qid]))
    store.delete_collection()
    summary = {k: statistics.mean(m[k] for m in per_query) for k in per_query[0]}
    summary["p50"], summary["p95"] = percentile(timings, 50), percentile(timings, 95)
    return summary, load_seconds


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--reuse", action="store_true", help="skip ingest; use the stored corpus")
    parser.add_argument("--encoder-sample", type=int, default=2000)
    parser.add_argument(
        "--scale", default="", help="comma-separated chunk totals, e.g. 10000,100000"
    )
    parser.add_argument(
        "--compare",
        choices=["langchain"],
        help="also run langchain-postgres (pip install langchain-postgres) on the same chunks",
    )
    args = parser.parse_args()

    rng = random.Random(13)
    corpus, queries, qrels = load(args.data, args.split)
    call_command("migrate", verbosity=0)
    embedder = get_embedder()
    embedder.embed_query("warm up")

    ingest = None
    if not (
        args.reuse and Document.objects.filter(collection__name="corpus").count() == len(corpus)
    ):
        wipe()
        ingest = ingest_corpus(corpus, embedder, args.encoder_sample)
    else:
        # An earlier --scale run left padding: it would change the BM25 statistics.
        if Document.objects.filter(collection__name="padding").delete()[0]:
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE django_rag_chunk")

    # Query embeddings, timed on their own.
    vectors, embed_ms = {}, []
    for text in queries.values():
        start = time.perf_counter()
        vectors[text] = embedder.embed_query(text)
        embed_ms.append(ms(time.perf_counter() - start))
    cached = CachedQueries(embedder, vectors)

    print(f"## {args.data.name}: search modes ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `python benchmarks/beir.py {' '.join(sys.argv[1:])}`")
    print(
        f"- Embedder: {embedder.model_name}, CPU; PostgreSQL + pgvector {'.'.join(map(str, pgvector_version()))}"
    )
    print(
        f"- Corpus: {len(corpus)} documents, {Chunk.objects.filter(collection__name='corpus').count()} chunks; "
        f"{len(queries)} {args.split} queries; a document counts as retrieved when any of its chunks is"
    )
    print(
        f"- Defaults: fusion {search_setting('FUSION')}, weights {search_setting('SEMANTIC_WEIGHT')}/"
        f"{search_setting('FULLTEXT_WEIGHT')}, candidates {search_setting('CANDIDATES')} x limit, "
        f"HNSW ef_search {search_setting('HNSW_EF_SEARCH')}\n"
    )
    print(
        "| mode | nDCG@10 | 95% interval | MRR@10 | Recall@10 | Recall@100 | search p50 | "
        "search p95 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    by_mode = {}
    for name, options in MODES.items():
        s = by_mode[name] = run_queries(queries, qrels, cached, options, "corpus")
        print(
            f"| {name} | {s['nDCG@10']:.4f} | {s['low']:.4f} .. {s['high']:.4f} | "
            f"{s['MRR@10']:.4f} | {s['Recall@10']:.4f} | {s['Recall@100']:.4f} | "
            f"{s['p50']:.1f} ms | {s['p95']:.1f} ms |"
        )
    if args.compare == "langchain":
        s, load_seconds = langchain_semantic(queries, qrels, cached)
        print(
            f"| langchain-postgres similarity search | {s['nDCG@10']:.4f} | - | {s['MRR@10']:.4f} | "
            f"{s['Recall@10']:.4f} | {s['Recall@100']:.4f} | {s['p50']:.1f} ms | {s['p95']:.1f} ms |"
        )
        print(
            f"\nlangchain-postgres {langchain_version()}: the same chunk texts and vectors loaded with "
            f"`add_embeddings` ({load_seconds:.0f} s), default settings (it creates no vector index), "
            "same server; it has no full-text or hybrid search."
        )
    print_hybrid_against_parts(by_mode)
    print(
        f"\nQuery embedding, timed separately: p50 {percentile(embed_ms, 50):.1f} ms, "
        f"p95 {percentile(embed_ms, 95):.1f} ms. Search times above exclude it (limit 100).\n"
    )

    if ingest:
        rate = ingest["chunks"] / ingest["seconds"]
        print("| ingest | value |\n|---|---|")
        print(
            f"| `rag.ingest_many` | {ingest['documents'] / ingest['seconds']:.1f} documents/s, "
            f"{rate:.1f} chunks/s ({ingest['seconds']:.0f} s) |"
        )
        print(
            f"| plain `SentenceTransformer.encode`, {ingest['sample']} of the same chunk texts, batch 32 | "
            f"{ingest['encoder']:.1f} chunks/s |"
        )
        print(f"| ratio | {rate / ingest['encoder']:.2f} |\n")

    small = Chunk.objects.filter(collection__name="one-percent").count()
    print(
        f"Filtered completeness, collection `one-percent` ({small} of {Chunk.objects.count()} chunks), "
        "limit 10: queries returning min(10, matching chunks), all from the collection\n"
    )
    print("| mode | complete |\n|---|---|")
    for name, (complete, total) in completeness(queries, cached, rng).items():
        print(f"| {name} | {complete}/{total} |")

    if args.scale:
        sample = dict(list(queries.items())[:100])
        print(
            "\nLatency as the corpus grows (unscoped search, limit 10, 100 queries, p50 / p95 ms)\n"
        )
        print("| chunks | " + " | ".join(MODES) + " |")
        print("|---|" + "---|" * len(MODES))
        for target in [int(x) for x in args.scale.split(",")]:
            pad_to(target, rng)
            cells = []
            for options in MODES.values():
                timings = []
                for text in sample.values():
                    start = time.perf_counter()
                    rag.search(text, limit=10, embedder=cached, **options)
                    timings.append(ms(time.perf_counter() - start))
                cells.append(f"{percentile(timings, 50):.1f} / {percentile(timings, 95):.1f}")
            print(f"| {Chunk.objects.count()} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

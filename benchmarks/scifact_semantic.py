"""SciFact benchmark for the foundation: ingest throughput, semantic nDCG@10, and filtered
search completeness on a collection holding 1% of the chunks.

    python benchmarks/scifact_semantic.py [--data ../shared/data/scifact] [--queries 300]

Prints a Markdown report. It uses a private database (benchmarks/settings.py) and wipes the
django_rag tables in it first.
"""

from __future__ import annotations

import argparse
import json
import math
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

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from pgvector.django import CosineDistance  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.managers import pgvector_version  # noqa: E402


def load(data: Path):
    corpus = [json.loads(line) for line in (data / "corpus.jsonl").open()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (data / "queries.jsonl").open())}
    qrels: dict[str, dict[str, int]] = {}
    for line in list((data / "qrels" / "test.tsv").open())[1:]:
        qid, did, score = line.split()
        qrels.setdefault(qid, {})[did] = int(score)
    return corpus, queries, qrels


def ndcg_at_10(ranked: list[str], relevant: dict[str, int]) -> float:
    dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(relevant.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--encoder-sample", type=int, default=500)
    parser.add_argument(
        "--ef-search", type=int, default=None, help="override SEARCH['HNSW_EF_SEARCH']"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="search the corpus a previous run stored; skip ingest"
    )
    args = parser.parse_args()

    if args.ef_search:
        from django.conf import settings

        settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"HNSW_EF_SEARCH": args.ef_search}}
    corpus, queries, qrels = load(args.data)
    call_command("migrate", verbosity=0)
    embedder = get_embedder()
    embedder.embed_query("warm up")

    def passage(doc):
        return f"{doc['title']}\n\n{doc['text']}"

    encoder_rate = ingest_seconds = None
    if not (
        args.reuse and Document.objects.filter(collection__name="scifact").count() == len(corpus)
    ):
        Chunk.objects.all().delete()
        Document.objects.all().delete()
        Collection.objects.all().delete()
        # 1. The plain encoder, for reference (same model, batches of 32).
        sample = [passage(d) for d in corpus[: args.encoder_sample]]
        start = time.perf_counter()
        embedder.embed_documents(sample)
        encoder_rate = len(sample) / (time.perf_counter() - start)

        # 2. Ingest the whole corpus through rag.ingest (chunk, embed, write per document).
        start = time.perf_counter()
        for doc in corpus:
            rag.ingest(passage(doc), collection="scifact", source_id=doc["_id"], title=doc["title"])
        ingest_seconds = time.perf_counter() - start

        # 3. A collection holding 1% of the chunks: every 100th document, ingested again.
        for doc in corpus[::100]:
            rag.ingest(
                passage(doc), collection="one-percent", source_id=doc["_id"], title=doc["title"]
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_rag_chunk")
    chunk_total = Chunk.objects.filter(collection__name="scifact").count()
    all_chunks = Chunk.objects.count()
    small = Chunk.objects.filter(collection__name="one-percent").count()

    # 4. Semantic quality on the SciFact test queries.
    test_ids = [qid for qid in qrels if qid in queries][: args.queries]
    ndcgs, recalls, latencies, unscoped_ms, embed_ms = [], [], [], [], []
    for qid in test_ids:
        t = time.perf_counter()
        embedder.embed_query(queries[qid])
        embed_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        rag.search(queries[qid], limit=10)
        unscoped_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        results = rag.search(queries[qid], collection="scifact", limit=30)
        latencies.append((time.perf_counter() - t) * 1000)
        ranked = list(dict.fromkeys(r.source_id for r in results))
        ndcgs.append(ndcg_at_10(ranked, qrels[qid]))
        recalls.append(len(set(ranked[:10]) & set(qrels[qid])) / len(qrels[qid]))

    # 5. Filtered completeness on the 1% collection.
    naive_rows, our_rows, exact_match, filtered_ms = [], [], [], []
    one_percent = Collection.objects.get(name="one-percent")
    for qid in test_ids[:100]:
        vector = embedder.embed_query(queries[qid])
        naive = (
            Chunk.objects.filter(collection=one_percent)
            .annotate(distance=CosineDistance("embedding", vector))
            .order_by("distance")[:10]
        )
        with transaction.atomic(), connection.cursor() as cursor:
            # What plain pgvector does once the planner picks the HNSW index (as it does on
            # large tables): scan the index, then filter.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            naive_rows.append(len(list(naive)))
        t = time.perf_counter()
        results = rag.search(queries[qid], collection="one-percent", limit=10)
        filtered_ms.append((time.perf_counter() - t) * 1000)
        our_rows.append(len(results))
        exact = list(
            Chunk.objects.filter(collection=one_percent)
            .annotate(distance=CosineDistance("embedding", vector))
            .order_by("distance", "pk")
            .values_list("pk", flat=True)[:10]
        )
        exact_match.append(len({r.chunk_id for r in results} & set(exact)) / len(exact))

    print("## SciFact: ingest, semantic quality, filtered completeness\n")
    print(f"- Command: `python benchmarks/scifact_semantic.py {' '.join(sys.argv[1:])}`")
    print(f"- HNSW ef_search: {search_setting('HNSW_EF_SEARCH')}")
    print(
        f"- Embedder: {embedder.model_name} on CPU; pgvector {'.'.join(map(str, pgvector_version()))}"
    )
    print(f"- Corpus: {len(corpus)} documents -> {chunk_total} chunks\n")
    print("| measure | value |")
    print("|---|---|")
    if ingest_seconds is not None:
        print(
            f"| plain encoder throughput ({args.encoder_sample} passages, batch 32) | {encoder_rate:.1f} passages/s |"
        )
        print(
            f"| `rag.ingest` throughput, one call per document | {len(corpus) / ingest_seconds:.1f} documents/s, {chunk_total / ingest_seconds:.1f} chunks/s ({ingest_seconds:.0f} s) |"
        )
    print(f"| semantic nDCG@10 ({len(test_ids)} test queries) | {statistics.mean(ndcgs):.4f} |")
    print(f"| semantic Recall@10 | {statistics.mean(recalls):.4f} |")
    print(
        f"| query embedding alone p50 / p95 | {percentile(embed_ms, 50):.1f} / {percentile(embed_ms, 95):.1f} ms |"
    )
    print(
        f"| unscoped search, limit 10, p50 / p95 (incl. query embedding) | {percentile(unscoped_ms, 50):.1f} / {percentile(unscoped_ms, 95):.1f} ms |"
    )
    print(
        f"| search scoped to `scifact` (99% of chunks), limit 30, p50 / p95 | {percentile(latencies, 50):.1f} / {percentile(latencies, 95):.1f} ms |"
    )
    print(
        f"| 1% collection: chunks in it / in the table | {small} / {all_chunks} ({100 * small / all_chunks:.2f}%) |"
    )
    print(
        f"| plain HNSW + filter: rows returned for LIMIT 10 (mean over {len(naive_rows)} queries) | {statistics.mean(naive_rows):.2f} |"
    )
    print(
        f"| `rag.search(collection=...)`: rows returned for limit 10 (mean, min) | {statistics.mean(our_rows):.2f}, {min(our_rows)} |"
    )
    print(
        f"| `rag.search(collection=...)`: overlap with the exact top 10 | {100 * statistics.mean(exact_match):.1f}% |"
    )
    print(
        f"| search scoped to the 1% collection, limit 10, p50 / p95 | {percentile(filtered_ms, 50):.1f} / {percentile(filtered_ms, 95):.1f} ms |"
    )


if __name__ == "__main__":
    main()

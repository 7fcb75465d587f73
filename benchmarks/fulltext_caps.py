"""Capping what one full-text search scores, against the exact search (issue 33: the
"approximate mode" and "cost cap" options): what each cap saves at a million chunks and what it
costs in ranking quality, plus whether PostgreSQL's parallel workers can share the scoring.

Per SciFact test question, on the SQL backend (exact; the tests compare it with brute force):

- **exact**: ``Chunk.objects.fulltext_hits`` as shipped (MaxScore, then one threshold round);
- **first round within N postings**: only the first round, whose candidates are the chunks
  holding the query's rarest words, as many as fit in N postings (the shipped search starts
  with 2,000). Its ten are scored exactly; chunks of common words only are never looked at.
  This is a cap on what one search scores, whatever the corpus size (but the rarest word,
  which is always taken, may itself be common);
- **bounds scaled to F x idf**: the first round, then a threshold round whose word bounds are
  F times the word's idf (clipped at the true bound; the true one is about (k1 + 1) x idf)
  instead of the provable bound, so the round matches chunks holding more of the words.

Reported: nDCG@10 against the SciFact qrels (chunks mapped to their documents, as
``benchmarks/beir.py`` does), the questions whose top 10 (chunk ids, in order) equals the exact
one, and p50 / p95 ms. The variants run one after the other over all questions (exact first),
so a cold cache weighs on exact.

``--parallel K`` then times, for the K questions whose exact search is slowest, the last
statement of the exact search (the round that scores the most chunks) as shipped, and with the
scoring written as a ``PARALLEL SAFE`` SQL function (created for the run, then dropped), with
``max_parallel_workers_per_gather`` 0 and 2: the shipped scoring is a correlated subquery,
which PostgreSQL evaluates above a Gather node, in the leader only.

    DJANGO_RAG_BENCHMARK_DB=/tmp/bench_1m python benchmarks/fulltext_caps.py --queries 300 \\
        --parallel 3

Needs a benchmark database holding the SciFact corpus (``benchmarks/beir.py``), padded or not
(``benchmarks/million.py``).
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

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from benchmarks.beir import load, metrics, percentile  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.models import Chunk  # noqa: E402
from django_rag.models.bm25 import TermWeights, limit_terms, term_weights, threshold_query  # noqa: E402
from django_rag.models.fulltext_query import quote_terms  # noqa: E402
from django_rag.models.fulltext_search import FULLTEXT_CANDIDATE_BUDGET  # noqa: E402


class ScaledBounds(TermWeights):
    """Term weights whose bound is ``factor`` x (idf x query weight) per word, never above the
    true bound: not a bound any more, a guess at what a word typically adds."""

    factor = 1.0

    def upper_bound(self, terms, boosts=()):
        true = super().upper_bound(terms, boosts)
        scoring = dict(zip(self.terms, self.scoring(), strict=True))
        guess = sum(self.factor * scoring[t] for t in terms) + sum(w for _, w in boosts)
        return min(true, guess)


def first_round(query: str, budget: int, limit: int):
    """The shipped search's first round with a posting budget of ``budget``: its hits, whether
    it took every word, and what a later round needs."""
    base = Chunk.objects.all()
    parsed = base._parsed(query, "natural")
    weights = term_weights(parsed.terms, counts=parsed.counts)
    parsed, weights = limit_terms(parsed, weights)
    boosts = weights.boosts(parsed)
    scored = base.without_excluded(parsed).with_bm25(weights, boosts)
    frequency = dict(zip(weights.terms, weights.frequencies, strict=True))
    order = sorted(weights.terms, key=frequency.__getitem__)
    n, postings = 0, 0
    while n < len(order) and (n < 1 or postings + frequency[order[n]] <= budget):
        postings += frequency[order[n]]
        n += 1
    hits = list(
        scored.matching(quote_terms(order[:n]))
        .order_by("-fulltext_score", "pk")
        .values_list("pk", "fulltext_score")[:limit]
    )
    return hits, n == len(order), weights, boosts, scored, order


def capped(budget: int):
    def run(query: str, limit: int):
        return first_round(query, budget, limit)[0]

    return run


def scaled(factor: float):
    def run(query: str, limit: int):
        hits, complete, weights, boosts, scored, order = first_round(
            query, FULLTEXT_CANDIDATE_BUDGET, limit
        )
        if complete or len(hits) < limit:
            return hits
        guess = ScaledBounds(
            weights.terms,
            weights.frequencies,
            weights.idf,
            weights.average_length,
            max_tf=weights.max_tf,
            min_length=weights.min_length,
            query_weights=weights.query_weights,
        )
        guess.factor = factor
        narrow = threshold_query(guess, hits[-1][1] - sum(w for _, w in boosts))
        found = list(
            scored.matching(narrow or quote_terms(order))
            .order_by("-fulltext_score", "pk")
            .values_list("pk", "fulltext_score")[:limit]
        )
        # The first round's hits were scored exactly too: keep the best of both.
        return sorted(set(found) | set(hits), key=lambda hit: (-hit[1], hit[0]))[:limit]

    return run


def documents(hits) -> list[str]:
    pks = [pk for pk, _ in hits]
    source = dict(Chunk.objects.filter(pk__in=pks).values_list("pk", "document__source_id"))
    return list(dict.fromkeys(source[pk] for pk in pks))


SCORING_FUNCTION = """
CREATE OR REPLACE FUNCTION pg_temp.bm25_score(
    vector tsvector, length integer, terms text[], weights float8[], k1 float8, b float8,
    average float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 1000 AS $$
SELECT coalesce(sum(q.w * m.tf * (k1 + 1) / (m.tf + k1 * (1 - b + b * length / average))), 0)
FROM (SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf
      FROM unnest(ts_filter(setweight(vector, 'A', terms), '{a}')) u) m
JOIN unnest(terms, weights) AS q(term, w) ON q.term = m.lexeme $$
"""


def parallel(queries: list[str], limit: int) -> None:
    """The slowest questions' last round: scoring as shipped against a parallel-safe function,
    without and with two parallel workers."""
    k1, b = float(search_setting("BM25_K1")), float(search_setting("BM25_B"))
    print(
        "\n| question | chunks scored | workers | shipped (correlated subquery) ms | "
        "parallel-safe function ms |\n|---|---|---|---|---|"
    )
    with connection.cursor() as cursor:
        cursor.execute(SCORING_FUNCTION)
        for query in queries:
            with CaptureQueriesContext(connection) as captured:
                Chunk.objects.fulltext_hits(query, limit=limit)
            shipped = captured.captured_queries[-1]["sql"]
            parsed = Chunk.objects.all()._parsed(query, "natural")
            weights = limit_terms(parsed, term_weights(parsed.terms, counts=parsed.counts))[1]
            start = shipped.index("(SELECT coalesce(sum(q.idf")
            end = shipped.index("ON q.term = m.lexeme)", start) + len("ON q.term = m.lexeme)")
            call = cursor.mogrify(
                "pg_temp.bm25_score(django_rag_chunk.search_vector, django_rag_chunk.fts_length, "
                "%s::text[], %s::float8[], %s, %s, %s)",
                [weights.terms, weights.scoring(), k1, b, weights.average_length],
            )
            function = shipped[:start] + call + shipped[end:]
            where = shipped[shipped.index(" WHERE ") :].split(" ORDER BY ")[0]
            cursor.execute(f"SELECT count(*) FROM django_rag_chunk{where}")
            scored = cursor.fetchone()[0]
            for workers in (0, 2):
                cursor.execute(f"SET max_parallel_workers_per_gather = {workers}")
                cells = []
                for sql in (shipped, function):
                    begin = time.perf_counter()
                    cursor.execute(sql)
                    cursor.fetchall()
                    cells.append(f"{(time.perf_counter() - begin) * 1000:.0f}")
                print(f"| {query[:50]}... | {scored:,} | {workers} | {' | '.join(cells)} |")
        cursor.execute("RESET max_parallel_workers_per_gather")
        cursor.execute("DROP FUNCTION pg_temp.bm25_score")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--budgets", default="2000,8000", help="first-round posting budgets")
    parser.add_argument("--factors", default="1.6", help="bound factors (x idf)")
    parser.add_argument("--parallel", type=int, default=0, help="slowest questions to time")
    args = parser.parse_args()

    _, queries, qrels = load(Path(args.data), "test")
    items = list(queries.items())[: args.queries]
    variants = {"exact (as shipped)": lambda q, limit: Chunk.objects.fulltext_hits(q, limit=limit)}
    for budget in (int(b) for b in args.budgets.split(",") if b):
        variants[f"first round within {budget:,} postings"] = capped(budget)
    for factor in (float(f) for f in args.factors.split(",") if f):
        variants[f"bounds scaled to {factor:g} x idf"] = scaled(factor)

    chunks = Chunk.objects.count()
    print(
        f"{chunks:,} chunks, {len(items)} SciFact test questions, limit {args.limit}; "
        f"load average at start {os.getloadavg()[0]:.1f}\n"
    )
    print("| search | nDCG@10 | same top 10 as exact | p50 / p95 ms |\n|---|---|---|---|")
    exact, exact_ms = {}, {}
    for position, (name, run) in enumerate(variants.items()):
        timings, ndcg, same = [], [], 0
        for qid, text in items:
            begin = time.perf_counter()
            hits = run(text, args.limit)
            elapsed = (time.perf_counter() - begin) * 1000
            timings.append(elapsed)
            if position == 0:  # the exact search: the reference of the others
                exact[qid], exact_ms[qid] = hits, elapsed
            same += [pk for pk, _ in hits] == [pk for pk, _ in exact[qid]]
            ndcg.append(metrics(documents(hits), qrels[qid])["nDCG@10"])
        print(
            f"| {name} | {statistics.mean(ndcg):.4f} | {same} of {len(items)} | "
            f"{statistics.median(timings):.1f} / {percentile(timings, 95):.1f} |",
            flush=True,
        )
    if args.parallel:
        slowest = sorted(exact_ms, key=exact_ms.__getitem__, reverse=True)[: args.parallel]
        parallel([queries[qid] for qid in slowest], args.limit)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Full-text latency: ``rag.search(mode="fulltext")`` with MaxScore's loose and tight bounds.

In one run, on the same rows and the same queries, it times full-text searches (limit 10,
unscoped) three ways: as before (each remaining term bounded by idf x (k1 + 1); a round that
cannot stop widens to 8 times the postings: ``previous_fulltext_hits`` below, a copy of the old
code), with the stored per-term bounds (largest tf, smallest chunk length, migration 0008) in
that old loop, and as now (those bounds; a round that cannot stop widens only to the terms after
which the rest cannot reach its last score, when that is fewer postings). The ranking is the
same (compared on every query); what changes is how many terms' postings are scored before the
result is proven. It prints p50 / p95 / mean ms and the mean number of rounds (ranking queries)
per search.

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_bm25 \\
        python benchmarks/fulltext_latency.py --chunks 13000,100000 --queries 200

The text is synthetic: chunks of 40 to 160 words drawn from a 20,000-word vocabulary with a
Zipf distribution (exponent 1.1), so a few words are in most chunks and most words in few.
Queries have 3 to 8 distinct words, each from the same Zipf distribution (common words) or
uniform over the vocabulary (mostly rare words), half and half. Rows are added through the ORM
and ``index_chunks`` up to each size (an existing database is reused and topped up); the
embedding column gets a constant vector and the HNSW index is dropped in this database (the
benchmark searches full text only). It uses benchmarks/settings.py (the embedded server in
``DJANGO_RAG_BENCHMARK_DB``, else ``$TMP/django_rag_benchmarks``, or ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import os
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
from django.test.utils import CaptureQueriesContext  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conf import embedding_dimensions, get_setting  # noqa: E402
from django_rag.models import Chunk, Collection, Document, fulltext_search, managers  # noqa: E402
from django_rag.models.fulltext import TermWeights, quote_terms, term_weights  # noqa: E402
from django_rag.store.statistics import compact_statistics, index_chunks  # noqa: E402

VOCABULARY = 20000
ZIPF = 1.1
SYLLABLES = "ba be bi bo bu da de di do du ka ke ki ko ku la le li lo lu ma me mi mo mu".split()


def words() -> list[str]:
    """Distinct pronounceable words (stemming leaves them distinct: each ends in a digit)."""
    out = []
    for i in range(VOCABULARY):
        a, b = divmod(i, len(SYLLABLES))
        out.append(SYLLABLES[a % len(SYLLABLES)] + SYLLABLES[b] + f"x{i // 625}")
    return out


def zipf_probabilities() -> np.ndarray:
    weights = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF
    return weights / weights.sum()


def fill_to(target: int, vocabulary: list[str], rng: np.random.Generator) -> None:
    collection, _ = Collection.objects.get_or_create(name="zipf")
    current = Chunk.objects.count()
    probabilities = zipf_probabilities()
    vector = [1.0] + [0.0] * (embedding_dimensions() - 1)
    batch = 5000
    while current < target:
        n = min(batch, target - current)
        document = Document.objects.create(
            collection=collection,
            source_id=f"zipf-{current}",
            content="synthetic",
            content_hash=f"zipf-{current}",
            status=Document.Status.COMPLETED,
            chunk_count=n,
        )
        lengths = rng.integers(40, 161, n)
        picks = rng.choice(VOCABULARY, size=int(lengths.sum()), p=probabilities)
        rows, start = [], 0
        for i, length in enumerate(lengths):
            text = " ".join(vocabulary[j] for j in picks[start : start + length])
            start += length
            rows.append(
                Chunk(
                    document=document,
                    collection=collection,
                    chunk_index=i,
                    text=text,
                    token_count=int(length),
                    embedding=vector,
                    embedding_model="synthetic",
                )
            )
        Chunk.objects.bulk_create(rows, batch_size=1000)
        index_chunks(document_id=document.pk)
        compact_statistics()
        current += n
        print(f"  {current} chunks", file=sys.stderr)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def make_queries(count: int, vocabulary: list[str], rng: np.random.Generator) -> list[str]:
    probabilities = zipf_probabilities()
    queries = []
    for _ in range(count):
        k = int(rng.integers(3, 9))
        chosen: list[str] = []
        while len(chosen) < k:
            if rng.random() < 0.5:
                word = vocabulary[int(rng.choice(VOCABULARY, p=probabilities))]
            else:
                word = vocabulary[int(rng.integers(0, VOCABULARY))]
            if word not in chosen:
                chosen.append(word)
        queries.append(" ".join(chosen))
    return queries


def loose_upper_bound(self, terms, boosts=()):
    """The bound before migration 0008: every remaining term at idf x (k1 + 1)."""
    k1 = float(get_setting("SEARCH")["BM25_K1"])
    weight = dict(zip(self.terms, self.idf, strict=True))
    return sum(weight[t] for t in terms) * (k1 + 1) + sum(w for _, w in boosts)


def previous_fulltext_hits(self, query, *, limit, weights=None, syntax="natural", **options):
    """``ChunkQuerySet.fulltext_hits`` before this change: each round that cannot stop widens
    to 8 times the postings (the same terms again when the next one does not fit)."""
    parsed = self._parsed(query, syntax)
    if parsed.match is None:
        return []
    weights = weights or term_weights(parsed.terms, using=self.db, counts=parsed.counts)
    boosts = weights.boosts(parsed)
    scored = self.without_excluded(parsed).with_bm25(weights, boosts)
    order = sorted(range(len(weights.terms)), key=lambda i: weights.frequencies[i])
    budget = fulltext_search.FULLTEXT_CANDIDATE_BUDGET
    while True:
        if parsed.phrases:
            chosen, rest = weights.terms, []
        else:
            chosen, postings = [], 0
            for i in order:
                if chosen and postings + weights.frequencies[i] > budget:
                    break
                chosen.append(weights.terms[i])
                postings += weights.frequencies[i]
            rest = [t for t in weights.terms if t not in chosen]
        tsquery = parsed.match if parsed.phrases else quote_terms(chosen)
        hits = list(
            scored.matching(tsquery)
            .order_by("-fulltext_score", "pk")
            .values_list("pk", "fulltext_score")[:limit]
        )
        bound = weights.upper_bound(rest, boosts)
        if not rest or (len(hits) == limit and hits[-1][1] >= bound):
            return hits
        budget *= 8


def run(queries: list[str], warmup: int, limit: int) -> tuple[list[float], float, list]:
    results = []
    for query in queries[:warmup]:
        rag.search(query, mode="fulltext", limit=limit)
    timings = []
    with CaptureQueriesContext(connection) as captured:
        for query in queries:
            start = time.perf_counter()
            found = rag.search(query, mode="fulltext", limit=limit)
            timings.append((time.perf_counter() - start) * 1000)
            results.append([(r.chunk_id, round(r.score, 6)) for r in found])
    rounds = sum("fulltext_score" in q["sql"] and "LIMIT" in q["sql"] for q in captured)
    return timings, rounds / len(queries), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="13000", help="sizes, e.g. 13000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX IF EXISTS django_rag_chunk_hnsw_idx")
    rng = np.random.default_rng(11)
    vocabulary = words()
    queries = make_queries(args.queries, vocabulary, np.random.default_rng(5))
    tight_bound = TermWeights.upper_bound
    current_hits = managers.ChunkQuerySet.fulltext_hits
    variants = {
        "before: idf x (k1 + 1), postings x 8": (loose_upper_bound, previous_fulltext_hits),
        "tight bounds, postings x 8": (tight_bound, previous_fulltext_hits),
        "after: tight bounds, widen to what is needed": (tight_bound, current_hits),
    }
    print(
        f"{args.queries} queries of 3-8 words after {args.warmup} warm-up, limit {args.limit}; ms\n"
    )
    print("| chunks | MaxScore bound, rounds | p50 | p95 | mean | rounds per search |")
    print("|---|---|---|---|---|---|")
    for target in [int(x) for x in args.chunks.split(",")]:
        fill_to(target, vocabulary, rng)
        total = Chunk.objects.count()
        outcomes = []
        for name, (bound, hits) in variants.items():
            TermWeights.upper_bound = bound
            managers.ChunkQuerySet.fulltext_hits = hits
            try:
                timings, rounds, results = run(queries, args.warmup, args.limit)
            finally:
                TermWeights.upper_bound = tight_bound
                managers.ChunkQuerySet.fulltext_hits = current_hits
            outcomes.append(results)
            print(
                f"| {total:,} | {name} | {np.percentile(timings, 50):.0f} | "
                f"{np.percentile(timings, 95):.0f} | {np.mean(timings):.0f} | {rounds:.2f} |",
                flush=True,
            )
        same = sum(len({repr(o[i]) for o in outcomes}) == 1 for i in range(len(queries)))
        print(f"|  | same top {args.limit} (ids, scores) in all three | {same} of {len(queries)} |")


if __name__ == "__main__":
    main()

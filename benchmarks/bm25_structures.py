"""Three BM25 posting structures in ordinary tables, prototyped side by side on the same rows
against today's plain-SQL backend (issue 33 item 1; docs/search.md "Bounded BM25 structures:
what was measured"):

- **block-max postings**: one row per (collection, term, block of 2^bits chunk ids) holding the
  block's postings (chunk ids, tf, lengths) and its bounds (largest tf, shortest chunk). A
  search reads the bounds of its words' blocks, scores the postings of the most promising
  blocks first, and stops when no unread block's bound reaches the ``limit``-th score: exact,
  and the chunks are never read.
- **impact tiers**: each word's postings ordered by their BM25 tf part, in tiers of 64, 256,
  1,024, ... postings (:class:`Tiers`, a threshold algorithm): exact, the few chunks that may
  still enter the results at the end are scored from their rows.
- **sparsevec through pgvector**: each chunk's BM25 tf parts (at the average length of the
  build) as a ``sparsevec`` over a term dictionary, searched by inner product with the
  query's idf weights through an HNSW index (pgvector is the one extension such a site has):
  approximate.

Both are built from the chunk table's own full-text vectors into the schema ``bm25_proto``
(dropped and built again with ``--build``); none is maintained by writes here: this measures
what a search costs on each, and the reference is the search the app runs today (exact; the
tests compare it with brute force). Per SciFact test question, in turn: reference, block-max,
impact tiers, sparsevec; top-10 agreement is against the reference.

    DJANGO_RAG_BENCHMARK_DB=/tmp/bench_100k python benchmarks/bm25_structures.py --build

Needs a benchmark database holding the SciFact corpus (``benchmarks/beir.py``), padded or not
(``benchmarks/million.py``, or ``--pad N`` here: the same padding, GIN index only).
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

from benchmarks.beir import load  # noqa: E402
from django_rag.conf import search_setting  # noqa: E402
from django_rag.models import Chunk  # noqa: E402
from django_rag.models.bm25 import limit_terms, term_weights, threshold_query  # noqa: E402
from django_rag.models.fulltext_query import quote_terms  # noqa: E402

SCHEMA = "bm25_proto"
# Impact tiers: a term's postings by impact, best first, in tiers of 64, 256, 1024, ... postings.
TIER_FIRST = 64
# Rounds go on until at most this many chunks may still enter the results; they are then
# scored exactly from their rows.
RESCORE_MAX = 100


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def execute(sql: str, params=None) -> float:
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return time.perf_counter() - start


def fetch(sql: str, params=None) -> list:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def size(relation: str) -> int:
    return fetch("SELECT pg_total_relation_size(%s::regclass)", [relation])[0][0]


def tf_part(tf: str, length: str) -> str:
    """BM25's tf part in SQL, as the reference scores it (``bm25.bm25_sql``); %(k1)s etc."""
    return f"{tf} * (%(k1)s + 1) / ({tf} + %(k1)s * (1 - %(b)s + %(b)s * {length} / %(avgdl)s))"


def build(bits: int, avgdl: float, *, sparse: bool = True) -> dict[str, float]:
    """The three structures (sparsevec unless ``sparse`` is False) from ``django_rag_chunk``:
    seconds per step."""
    execute("SET maintenance_work_mem = '2GB'")
    execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    execute(f"CREATE SCHEMA {SCHEMA}")
    seconds = {}
    k1, b = float(search_setting("BM25_K1")), float(search_setting("BM25_B"))
    seconds["block-max postings: table"] = execute(
        f"CREATE TABLE {SCHEMA}.blocks AS "
        f"SELECT c.collection_id, u.lexeme AS term, (c.id >> {int(bits)})::int AS block, "
        "max(u.tf)::int AS max_tf, min(c.fts_length)::int AS min_length, "
        "array_agg(c.id ORDER BY c.id) AS chunks, array_agg(u.tf ORDER BY c.id) AS tfs, "
        "array_agg(c.fts_length ORDER BY c.id) AS lengths "
        "FROM django_rag_chunk c CROSS JOIN LATERAL (SELECT lexeme, "
        "coalesce(array_length(positions, 1), 1)::int AS tf FROM unnest(c.search_vector)) u "
        "GROUP BY 1, 2, 3"
    )
    seconds["block-max postings: index"] = execute(
        f"CREATE UNIQUE INDEX blocks_key ON {SCHEMA}.blocks (term, collection_id, block) "
        "INCLUDE (max_tf, min_length)"
    )
    execute(f"VACUUM ANALYZE {SCHEMA}.blocks")
    seconds["impact tiers: table"] = execute(
        f"CREATE TABLE {SCHEMA}.tiers AS WITH p AS (SELECT c.collection_id, u.lexeme AS term, "
        "c.id AS chunk, "
        + tf_part("u.tf", "c.fts_length")
        + " AS impact FROM django_rag_chunk c CROSS JOIN LATERAL (SELECT lexeme, "
        "coalesce(array_length(positions, 1), 1)::float8 AS tf FROM unnest(c.search_vector)) u), "
        "r AS (SELECT *, floor(log(4, 3.0 * (row_number() OVER (PARTITION BY collection_id, term "
        "ORDER BY impact DESC, chunk) - 1) / %(first)s + 1))::int AS tier FROM p) "
        "SELECT collection_id, term, tier, max(impact) AS max_impact, "
        "array_agg(chunk ORDER BY impact DESC, chunk) AS chunks, "
        "array_agg(impact ORDER BY impact DESC, chunk) AS impacts FROM r GROUP BY 1, 2, 3",
        {"k1": k1, "b": b, "avgdl": avgdl, "first": TIER_FIRST},
    )
    seconds["impact tiers: index"] = execute(
        f"CREATE UNIQUE INDEX tiers_key ON {SCHEMA}.tiers (term, collection_id, tier) "
        "INCLUDE (max_impact)"
    )
    execute(f"VACUUM ANALYZE {SCHEMA}.tiers")
    if not sparse:
        return seconds
    seconds["sparsevec: dictionary and vectors"] = execute(
        f"CREATE TABLE {SCHEMA}.vocab AS SELECT term, (row_number() OVER (ORDER BY term))::int "
        f"AS id FROM (SELECT DISTINCT term FROM {SCHEMA}.blocks) t"
    )
    execute(f"CREATE UNIQUE INDEX ON {SCHEMA}.vocab (term) INCLUDE (id)")
    dims = fetch(f"SELECT count(*) FROM {SCHEMA}.vocab")[0][0]
    seconds["sparsevec: dictionary and vectors"] += execute(
        f"CREATE TABLE {SCHEMA}.sparse AS SELECT c.id, c.collection_id, "
        "(SELECT format('{%%s}/%%s', string_agg(v.id || ':' || "
        + tf_part("u.tf", "c.fts_length")
        + f", ',' ORDER BY v.id), {dims}) "
        "FROM (SELECT lexeme, coalesce(array_length(positions, 1), 1)::float8 AS tf "
        f"FROM unnest(c.search_vector)) u JOIN {SCHEMA}.vocab v ON v.term = u.lexeme"
        f")::sparsevec({dims}) AS v FROM django_rag_chunk c WHERE c.fts_length > 0",
        {"k1": k1, "b": b, "avgdl": avgdl},
    )
    seconds["sparsevec: HNSW index"] = execute(
        f"CREATE INDEX sparse_hnsw ON {SCHEMA}.sparse USING hnsw (v sparsevec_ip_ops)"
    )
    execute(f"ANALYZE {SCHEMA}.sparse")
    return seconds


class BlockMax:
    """Top-k over the block-max postings: bounds first, then blocks by bound, exact."""

    def __init__(self, first_batch: int):
        self.first_batch = first_batch
        self.statements = 0
        self.scored = 0

    def search(self, weights, limit: int) -> list[tuple[int, float]]:
        k1, b = float(search_setting("BM25_K1")), float(search_setting("BM25_B"))
        params = {
            "k1": k1,
            "b": b,
            "avgdl": weights.average_length,
            "terms": weights.terms,
            "w": weights.scoring(),
        }
        bounds = fetch(
            "SELECT p.collection_id, p.block, sum(q.w * "
            + tf_part("p.max_tf", "p.min_length")
            + f") AS ub FROM {SCHEMA}.blocks p "
            "JOIN unnest(%(terms)s::text[], %(w)s::float8[]) q(term, w) ON p.term = q.term "
            "GROUP BY 1, 2 ORDER BY ub DESC",
            params,
        )
        self.statements += 1
        top: list[tuple[int, float]] = []
        i, batch = 0, self.first_batch
        while i < len(bounds):
            theta = top[-1][1] if len(top) == limit else None
            # A block whose bound cannot reach the limit-th score is never read (>=: a tie on
            # a smaller id would come first). The bound's rounding is covered by the margin.
            if theta is not None and bounds[i][2] * (1 + 1e-9) < theta:
                break
            j = i
            while j < len(bounds) and j - i < batch:
                if theta is not None and bounds[j][2] * (1 + 1e-9) < theta:
                    break
                j += 1
            chosen = bounds[i:j]
            rows = fetch(
                "SELECT u.chunk, sum(q.w * "
                + tf_part("u.tf", "u.len")
                + ") AS s, count(*) FROM unnest(%(collections)s::int[], %(blocks)s::int[]) "
                f"k(collection_id, block) JOIN {SCHEMA}.blocks p ON p.collection_id = "
                "k.collection_id AND p.block = k.block "
                "JOIN unnest(%(terms)s::text[], %(w)s::float8[]) q(term, w) ON p.term = q.term "
                "CROSS JOIN LATERAL unnest(p.chunks, p.tfs, p.lengths) u(chunk, tf, len) "
                "GROUP BY u.chunk ORDER BY s DESC, u.chunk LIMIT %(limit)s",
                {
                    **params,
                    "collections": [c for c, _, _ in chosen],
                    "blocks": [blk for _, blk, _ in chosen],
                    "limit": limit,
                },
            )
            self.statements += 1
            self.scored += len(chosen)
            top = sorted(
                [*top, *((pk, float(s)) for pk, s, _ in rows)], key=lambda r: (-r[1], r[0])
            )[:limit]
            i, batch = j, batch * 2
        return top


class Tiers:
    """Top-k over impact-ordered tiers (a threshold algorithm), exact: each round reads one
    more tier of every word, and a chunk's partial sum of what has been read is a lower bound
    of its BM25, that sum plus the next tiers' largest impacts of the words not yet seen for it
    an upper bound. Rounds stop when no unseen chunk can reach the ``limit``-th lower bound and
    few seen ones still may; those are scored exactly from their rows."""

    def __init__(self):
        self.statements = 0
        self.rounds = 0
        self.rescored = 0

    def search(self, weights, limit: int) -> list[tuple[int, float]]:
        w = dict(zip(weights.terms, weights.scoring(), strict=True))
        heads: dict[tuple[int, str], dict[int, float]] = {}
        for collection, term, tier, impact in fetch(
            f"SELECT collection_id, term, tier, max_impact FROM {SCHEMA}.tiers "
            "WHERE term = ANY(%s)",
            [weights.terms],
        ):
            heads.setdefault((collection, term), {})[tier] = impact
        self.statements += 1
        if not heads:
            return []
        last = max(max(tiers) for tiers in heads.values())
        for r in range(last + 1):
            nxt = {key: tiers.get(r + 1, 0.0) for key, tiers in heads.items()}
            unseen: dict[int, float] = {}
            for (collection, term), impact in nxt.items():
                unseen[collection] = unseen.get(collection, 0.0) + w[term] * impact
            keys = list(nxt)
            rows = fetch(
                "WITH q AS (SELECT * FROM unnest(%(terms)s::text[], %(w)s::float8[]) q(term, w)), "
                "n AS (SELECT * FROM unnest(%(nc)s::int[], %(nt)s::text[], %(nb)s::float8[]) "
                "n(collection_id, term, nb)), "
                "u AS (SELECT unnest(%(uc)s::int[]) AS collection_id, "
                "unnest(%(ub)s::float8[]) AS unseen), "
                "s AS (SELECT x.chunk, p.collection_id, sum(q.w * x.impact) AS partial, "
                "sum(q.w * n.nb) AS seen_next FROM "
                f"{SCHEMA}.tiers p JOIN q ON q.term = p.term JOIN n ON n.collection_id = "
                "p.collection_id AND n.term = p.term CROSS JOIN LATERAL "
                "unnest(p.chunks, p.impacts) x(chunk, impact) WHERE p.tier <= %(r)s "
                "GROUP BY 1, 2), "
                "t AS (SELECT coalesce((SELECT partial FROM s ORDER BY partial DESC "
                "LIMIT 1 OFFSET %(k)s - 1), -1) AS theta) "
                "SELECT t.theta, s.chunk, s.partial FROM t, s JOIN u USING (collection_id) "
                "WHERE t.theta < 0 OR s.partial + u.unseen - s.seen_next >= t.theta * "
                "(1 - 1e-9) ORDER BY s.partial DESC, s.chunk LIMIT %(cap)s",
                {
                    "terms": weights.terms,
                    "w": weights.scoring(),
                    "nc": [c for c, _ in keys],
                    "nt": [t for _, t in keys],
                    "nb": [nxt[key] for key in keys],
                    "uc": list(unseen),
                    "ub": list(unseen.values()),
                    "r": r,
                    "k": limit,
                    "cap": RESCORE_MAX + 1,
                },
            )
            self.statements += 1
            self.rounds += 1
            if r == last:  # every tier read: the partial sums are the scores
                return [(pk, float(score)) for _, pk, score in rows[:limit]]
            theta = rows[0][0] if rows else -1
            if theta < 0:
                continue  # fewer than limit chunks seen yet
            if max(unseen.values()) * (1 + 1e-9) < theta and len(rows) <= RESCORE_MAX:
                self.rescored += len(rows)
                self.statements += 1
                return list(
                    Chunk.objects.filter(pk__in=[pk for _, pk, _ in rows])
                    .with_bm25(weights)
                    .order_by("-fulltext_score", "pk")
                    .values_list("pk", "fulltext_score")[:limit]
                )
        return []


def sparse_search(weights, limit: int, ef: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT v.id, w FROM unnest(%s::text[], %s::float8[]) q(term, w) "
            f"JOIN {SCHEMA}.vocab v ON v.term = q.term ORDER BY v.id",
            [weights.terms, weights.scoring()],
        )
        pairs = cursor.fetchall()
        if not pairs:
            return []
        cursor.execute(f"SELECT count(*) FROM {SCHEMA}.vocab")
        dims = cursor.fetchone()[0]
        query = "{" + ",".join(f"{i}:{w:.9g}" for i, w in pairs) + f"}}/{dims}"
        cursor.execute(f"SET hnsw.ef_search = {int(ef)}")
        cursor.execute(
            f"SELECT id FROM {SCHEMA}.sparse ORDER BY v <#> %s::sparsevec LIMIT %s",
            [query, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def analysis(questions: list[str], limit: int) -> None:
    """Why the bounds stay loose: the threshold round given the ideal threshold (the final
    ``limit``-th score, known in advance), and how slowly a common word's impacts fall."""
    search = Chunk.objects.all()
    ideal, matched, ratios, tiers_seen = [], [], [], {1: [], 2: [], 3: []}
    chunks = Chunk.objects.count()
    for question in questions:
        reference = Chunk.objects.fulltext_hits(question, limit=limit)
        if len(reference) < limit:
            continue
        start = time.perf_counter()
        parsed = search._parsed(question, "natural")
        parsed, weights = limit_terms(parsed, term_weights(parsed.terms, counts=parsed.counts))
        narrow = threshold_query(weights, reference[-1][1] * (1 - 1e-9))
        narrow = narrow or quote_terms(weights.terms)
        list(
            search.with_bm25(weights)
            .matching(narrow)
            .order_by("-fulltext_score", "pk")
            .values_list("pk", "fulltext_score")[:limit]
        )
        ideal.append((time.perf_counter() - start) * 1000)
        matched.append(search.matching(narrow).count())
        for i, term in enumerate(weights.terms):
            if weights.frequencies[i] < chunks / 50:  # common words: in 2% of chunks or more
                continue
            heads = dict(
                fetch(
                    f"SELECT tier, max(max_impact) FROM {SCHEMA}.tiers WHERE term = %s "
                    "GROUP BY tier",
                    [term],
                )
            )
            ratios.append(heads[0] * weights.scoring()[i] / weights.upper_bound([term]))
            for tier, values in tiers_seen.items():
                if tier in heads:
                    values.append(heads[tier] / heads[0])
    print(
        f"\nThe threshold round alone at the ideal threshold (statistics, one round): p50 / p95 "
        f"{statistics.median(ideal):.1f} / {percentile(ideal, 95):.1f} ms; chunks its query "
        f"matches median {statistics.median(matched):.0f}, p95 {percentile(matched, 95):,}, "
        f"max {max(matched):,}."
    )
    print(
        f"Common words ({len(ratios)} in these questions, in 2% of chunks or more): their "
        f"largest impact is {statistics.median(ratios):.2f} of the bound the statistics give "
        "(median); the largest impact past their best 64 / 320 / 1,344 postings is "
        + " / ".join(f"{statistics.median(v):.2f}" for v in tiers_seen.values())
        + " of their largest."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--bits", type=int, default=10, help="block = chunk id >> bits")
    parser.add_argument("--first-batch", type=int, default=4, help="blocks scored first")
    parser.add_argument("--ef", type=int, nargs="*", default=[40, 200], help="sparse ef_search")
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--pad", type=int, help="pad the chunk table to this many first")
    parser.add_argument("--no-sparse", action="store_true")
    parser.add_argument("--analysis", action="store_true", help="why the bounds stay loose")
    args = parser.parse_args()
    if args.pad:
        from benchmarks.million import GIN, pad
        from django_rag.conf import embedding_dimensions

        print(f"padding: {pad(args.pad, embedding_dimensions()):.0f} s")
        execute(f"CREATE INDEX IF NOT EXISTS {GIN} ON django_rag_chunk USING gin (search_vector)")
        execute("ANALYZE django_rag_chunk")
    _, queries, _ = load(Path(args.data), "test")
    questions = list(queries.values())[: args.queries]
    chunks = Chunk.objects.count()
    print(f"### {chunks:,} chunks, {len(questions)} SciFact test questions, limit {args.limit}\n")
    print(f"- Command: `python benchmarks/bm25_structures.py {' '.join(sys.argv[1:])}`")
    print(f"- Load average at start: {os.getloadavg()[0]:.1f}\n")
    if args.build:
        reference_weights = term_weights(["x"])
        for step, seconds in build(
            args.bits, reference_weights.average_length, sparse=not args.no_sparse
        ).items():
            print(f"- Build, {step}: {seconds:.1f} s")
        print(
            f"- Sizes: block-max postings {size(SCHEMA + '.blocks') / 2**20:.0f} MiB "
            f"({fetch(f'SELECT count(*) FROM {SCHEMA}.blocks')[0][0]:,} rows); "
            + (
                ""
                if args.no_sparse
                else f"sparsevec table + HNSW {size(SCHEMA + '.sparse') / 2**20:.0f} MiB; "
            )
            + f"GIN "
            f"{size('django_rag_chunk_fts_idx') / 2**20:.0f} MiB\n"
        )

    search = Chunk.objects.all()
    blockmax = BlockMax(args.first_batch)
    tiers = Tiers()
    timings: dict[str, list[float]] = {
        "reference (today's SQL backend)": [],
        "block-max": [],
        "impact tiers": [],
    }
    timings.update({f"sparsevec HNSW ef {ef}": [] for ef in ([] if args.no_sparse else args.ef)})
    agree = {name: 0 for name in timings}
    overlap = {name: 0.0 for name in timings}
    statements, blocks_read, tier_statements, rescored = [], [], [], []
    for question in questions:
        parsed = search._parsed(question, "natural")
        if parsed.match is None:
            continue
        Chunk.objects.fulltext_hits(question, limit=args.limit)  # warm
        start = time.perf_counter()
        reference = Chunk.objects.fulltext_hits(question, limit=args.limit)
        timings["reference (today's SQL backend)"].append((time.perf_counter() - start) * 1000)
        expected = [pk for pk, _ in reference]

        def weights_for(question=question):
            parsed = search._parsed(question, "natural")
            weights = term_weights(parsed.terms, counts=parsed.counts)
            return limit_terms(parsed, weights)[1]

        runs = {
            "block-max": lambda w: [pk for pk, _ in blockmax.search(w, args.limit)],
            "impact tiers": lambda w: [pk for pk, _ in tiers.search(w, args.limit)],
        }
        if not args.no_sparse:
            for ef in args.ef:
                runs[f"sparsevec HNSW ef {ef}"] = lambda w, ef=ef: sparse_search(w, args.limit, ef)
        for name, run in runs.items():
            run(weights_for())  # warm
            before = (blockmax.statements, blockmax.scored, tiers.statements, tiers.rescored)
            start = time.perf_counter()
            got = run(weights_for())  # the statistics read is part of every search
            timings[name].append((time.perf_counter() - start) * 1000)
            if name == "block-max":
                statements.append(blockmax.statements - before[0])
                blocks_read.append(blockmax.scored - before[1])
            if name == "impact tiers":
                tier_statements.append(tiers.statements - before[2])
                rescored.append(tiers.rescored - before[3])
            agree[name] += got == expected
            overlap[name] += len(set(got) & set(expected)) / max(len(expected), 1)
        agree["reference (today's SQL backend)"] += 1
        overlap["reference (today's SQL backend)"] += 1
    n = len(timings["block-max"])
    print("| structure | p50 / p95 ms | same top 10 | top-10 overlap |")
    print("|---|---|---|---|")
    for name, values in timings.items():
        if not values:
            continue
        print(
            f"| {name} | {statistics.median(values):.1f} / {percentile(values, 95):.1f} | "
            f"{agree[name]} of {n} | {overlap[name] / n:.3f} |"
        )
    if statements:
        print(
            f"\nBlock-max: statements per search median {statistics.median(statements):.0f} "
            f"(max {max(statements)}), blocks scored median {statistics.median(blocks_read):.0f} "
            f"(p95 {percentile(blocks_read, 95)}, max {max(blocks_read)})."
        )
    if tier_statements:
        print(
            f"Impact tiers: statements per search median {statistics.median(tier_statements):.0f}"
            f" (max {max(tier_statements)}), chunks scored from their rows median "
            f"{statistics.median(rescored):.0f} (max {max(rescored)})."
        )
    if args.analysis:
        analysis(questions, args.limit)


if __name__ == "__main__":
    main()

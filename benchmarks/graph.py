"""GraphRAG measurements on SciFact (docs/benchmarks.md#graphrag):

1. graph build overhead with a local extractor that needs no LLM (capitalised phrases +
   co-occurrence): chunks/s, and the share of the time spent in the extractor vs ours
   (entity embeddings, persistence);
2. Leiden on a synthetic graph of 10k entities and 50k relationships;
3. nDCG@10 of hybrid vs hybrid + graph (depth 0 and 1) on a sample of the corpus, with the
   paired difference to hybrid and its 95% bootstrap interval: with the configured
   ``GRAPH["WEIGHT"]`` / ``GRAPH["MIN_MATCH_SCORE"]`` (through ``rag.search``) and, for
   reference, the unweighted fusion without a gate (weight 1, gate 0).

The sample: every document judged for the split's queries, plus random others up to
``--sample-docs``. ``--split train`` draws ``--queries`` (300) of the 809 train queries, so the
train sample is built like the test one (300 queries, 600 documents), in its own collection.
``--sweep`` evaluates a grid of weights, gates and confidence scaling on the split (pick the
defaults on train, then report test untuned).

    python benchmarks/graph.py [--data ../shared/data/scifact] [--split test|train]
        [--sample-docs 600] [--queries 300] [--extractor capitalized|ner|spacy|llm] [--llm MODEL --api-base URL] [--sweep]

Each split's sample is one collection (full-text search scoped to it ranks with its own BM25
statistics); ``DJANGO_RAG_BENCHMARK_DB`` (benchmarks/settings.py) chooses the database.
"""

from __future__ import annotations

import argparse
import copy
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
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import load, metrics  # noqa: E402
from django_rag.conf import graph_number  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, paired_difference  # noqa: E402
from django_rag.graph import build_graph  # noqa: E402
from django_rag.graph import extractors as graph_extractors  # noqa: E402
from django_rag.graph.communities import leiden_levels  # noqa: E402
from django_rag.models import Chunk, Collection  # noqa: E402
from django_rag.retrieval import service  # noqa: E402

COLLECTIONS = {"test": "graph-sample", "train": "graph-sample-train"}
DEPTHS = (0, 1)
SWEEP_WEIGHTS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
SWEEP_GATES = (0.0, 0.4, 0.5, 0.6, 0.7, 0.75, 0.775, 0.8, 0.825, 0.85, 0.9)


class Timed(graph_extractors.CapitalizedEntityExtractor):
    seconds = 0.0

    def extract(self, text):
        start = time.perf_counter()
        try:
            return super().extract(text)
        finally:
            type(self).seconds += time.perf_counter() - start


class TimedCooccurrence(graph_extractors.CooccurrenceRelationshipExtractor):
    def extract(self, text, entities):
        start = time.perf_counter()
        try:
            return super().extract(text, entities)
        finally:
            Timed.seconds += time.perf_counter() - start


def sample(corpus, qrels, size, rng):
    """Every judged document of the queries, plus random others up to ``size``."""
    judged = {doc for rel in qrels.values() for doc in rel}
    by_id = {doc["_id"]: doc for doc in corpus}
    chosen = [by_id[d] for d in sorted(judged) if d in by_id]
    others = [doc for doc in corpus if doc["_id"] not in judged]
    chosen += rng.sample(others, max(0, size - len(chosen)))
    return chosen


def extractor_options(name: str, ner_model: str | None) -> dict:
    """``build_graph`` options for an extractor name (capitalized: timed, as in the docs)."""
    if name == "capitalized":
        return {
            "extractor": None,
            "entity_extractor": Timed(),
            "relationship_extractor": TimedCooccurrence(max_entities=12),
        }
    if name == "ner":
        options = {"model": ner_model} if ner_model else {}
        return {
            "extractor": None,
            "entity_extractor": graph_extractors.NEREntityExtractor(**options),
            "relationship_extractor": TimedCooccurrence(max_entities=12),
        }
    if name == "spacy":
        options = {"model": ner_model} if ner_model else {}
        return {
            "extractor": None,
            "entity_extractor": graph_extractors.SpacyEntityExtractor(**options),
            "relationship_extractor": TimedCooccurrence(max_entities=12),
        }
    return {"extractor": "llm"}  # needs DJANGO_RAG["LLM"]


def build(collection: str, name: str, ner_model: str | None) -> None:
    chunks = Chunk.objects.filter(collection__name=collection).count()
    Timed.seconds = 0.0
    start = time.perf_counter()
    totals = build_graph(collection, resume=False, **extractor_options(name, ner_model))
    seconds = time.perf_counter() - start
    line = (
        f"build ({name}): {chunks} chunks, {totals['entities']} entity findings, "
        f"{totals['relationships']} relationship findings in {seconds:.1f} s "
        f"= {chunks / seconds:.1f} chunks/s"
    )
    if name == "capitalized":
        line += (
            f"; extractor {Timed.seconds:.1f} s ({100 * Timed.seconds / seconds:.0f}%), "
            f"ours {seconds - Timed.seconds:.1f} s ({100 * (seconds - Timed.seconds) / seconds:.0f}%)"
        )
    print(line, flush=True)


def leiden(rng) -> None:
    """Leiden on 10k entities / 50k relationships (200 planted groups of 50)."""
    edges = set()
    while len(edges) < 50_000:
        group = rng.randrange(200)
        if rng.random() < 0.9:
            a, b = rng.sample(range(group * 50, group * 50 + 50), 2)
        else:
            a, b = rng.sample(range(10_000), 2)
        edges.add((min(a, b), max(a, b), 1.0))
    edges = sorted(edges)
    start = time.perf_counter()
    partitions = leiden_levels(edges, resolution=1.0, levels=1, max_cluster_size=1000, seed=42)
    print(
        f"leiden: 10,000 entities, {len(edges):,} relationships: "
        f"{time.perf_counter() - start:.2f} s, {len(partitions[0])} communities"
    )


def ndcg(results, relevant) -> float:
    return metrics(list(dict.fromkeys(r.source_id for r in results)), relevant)["nDCG@10"]


class Capture:
    """Wraps ``service.fuse_graph`` to keep, per search, the hybrid results (before fusion),
    the graph list and the match: every weight and gate can then be fused offline by the
    same function the search uses."""

    def __init__(self):
        self.real = service.fuse_graph
        self.last = None

    def __call__(self, results, found, match, **options):
        self.last = ([copy.copy(r) for r in results], [copy.copy(r) for r in found], match)
        return self.real(results, found, match, **options)


def capture_lists(queries, collection):
    """Per depth, per query: (hybrid results, graph list, match), the graph list ungated."""
    capture = Capture()
    service.fuse_graph = capture
    captured = {}
    try:
        with override_settings(DJANGO_RAG={"GRAPH": {"MIN_MATCH_SCORE": 0.0}}):
            for depth in DEPTHS:
                captured[depth] = []
                for text in queries.values():
                    capture.last = None
                    rag.search(
                        text, collection=collection, mode="hybrid", limit=100, graph=True,
                        graph_depth=depth,
                    )  # fmt: skip
                    captured[depth].append(capture.last)
    finally:
        service.fuse_graph = capture.real
    return captured


def fused(entry, weight, gate, rrf_k, scale=False):
    """What ``_with_graph`` returns for one captured search under ``weight`` and ``gate``."""
    results, found, match = entry
    results = [copy.copy(r) for r in results]
    if match.strength < gate or (gate > 0 and not match.entities):
        return results
    match = copy.copy(match)
    match.skipped = ""
    found = [copy.copy(r) for r in found]
    effective = weight * match.strength if scale else weight
    return service.fuse_graph(results, found, match, weight=effective, rrf_k=rrf_k)


def per_query(captured, relevant, weight, gate, rrf_k, scale=False):
    return [
        ndcg(fused(entry, weight, gate, rrf_k, scale), rel)
        for entry, rel in zip(captured, relevant, strict=True)
    ]


def dump(captured, queries, relevant, path) -> None:
    """The captured lists as plain data (ids, sources, scores, matched entities' names)."""
    import pickle

    from django_rag.models import Entity

    ids = {pk for entries in captured.values() for e in entries for pk in e[2].entities}
    names = dict(Entity.objects.filter(pk__in=ids).values_list("pk", "name"))
    data = {
        "queries": list(queries.values()),
        "relevant": relevant,
        "names": names,
        "depths": {
            depth: [
                (
                    [(r.chunk_id, r.source_id, r.score) for r in results],
                    [(r.chunk_id, r.source_id, r.graph_score) for r in found],
                    dict(match.entities),
                )
                for results, found, match in entries
            ]
            for depth, entries in captured.items()
        },
    }
    with open(path, "wb") as handle:
        pickle.dump(data, handle)


def paired(label, base, other) -> str:
    delta, low, high = paired_difference(base, other)
    verdict = "better" if low > 0 else "worse" if high < 0 else "within noise"
    return (
        f"{label}: nDCG@10 {statistics.mean(other):.4f}, minus hybrid {delta:+.4f} "
        f"(95% CI {low:+.4f} .. {high:+.4f}): {verdict}"
    )


def sweep(captured, relevant, rrf_k) -> None:
    hybrid = [ndcg(entry[0], rel) for entry, rel in zip(captured[0], relevant, strict=True)]
    print(f"hybrid: nDCG@10 {statistics.mean(hybrid):.4f}")
    strengths = sorted(entry[2].strength for entry in captured[0])
    quartiles = statistics.quantiles(strengths, n=4)
    print(
        "match strength (best entity similarity) per query: "
        f"min {strengths[0]:.3f}, quartiles {', '.join(f'{q:.3f}' for q in quartiles)}, "
        f"max {strengths[-1]:.3f}"
    )
    for gate in SWEEP_GATES:
        kept = sum(s >= gate for s in strengths)
        print(f"  gate {gate}: graph list fused for {kept}/{len(strengths)} queries")
    # Does the graph list get better as the match gets stronger? (depth 0, by strength)
    alone = [ndcg(entry[1], rel) for entry, rel in zip(captured[0], relevant, strict=True)]
    print(f"graph list alone (depth 0): nDCG@10 {statistics.mean(alone):.4f}")
    for low, high in ((0, 0.4), (0.4, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 1.01)):
        picked = [i for i, e in enumerate(captured[0]) if low <= e[2].strength < high]
        if picked:
            print(
                f"  match strength {low}-{min(high, 1)}: {len(picked)} queries, graph list "
                f"alone {statistics.mean(alone[i] for i in picked):.3f}, "
                f"hybrid {statistics.mean(hybrid[i] for i in picked):.3f}"
            )
    print("\nmean nDCG@10 minus hybrid (depth 0 | depth 1 | mean of both)")
    rows = []
    for scale in (False, True):
        for weight in SWEEP_WEIGHTS:
            for gate in SWEEP_GATES:
                deltas = []
                for depth in DEPTHS:
                    scores = per_query(captured[depth], relevant, weight, gate, rrf_k, scale)
                    deltas.append(statistics.mean(scores) - statistics.mean(hybrid))
                rows.append((statistics.mean(deltas), deltas, weight, gate, scale))
                print(
                    f"  weight {weight:<5} gate {gate:<4} scale {'on ' if scale else 'off'}: "
                    f"{deltas[0]:+.4f} | {deltas[1]:+.4f} | {statistics.mean(deltas):+.4f}",
                    flush=True,
                )
    # The rule: the best mean nDCG@10 over depths 0 and 1; among exact ties, the configuration
    # that keeps the graph most in play (most queries fused, then the larger weight, then
    # without scaling, the simpler).
    best = max(row[0] for row in rows)
    tied = [row for row in rows if row[0] >= best - 1e-9 and row[2] > 0]
    fused_for = {gate: sum(s >= gate for s in strengths) for gate in SWEEP_GATES}
    if not tied:
        print(f"\nchosen: the graph list never takes part (best {best:+.4f} at weight 0)")
        return
    mean, deltas, weight, gate, scale = max(
        tied, key=lambda row: (fused_for[row[3]], row[2], not row[4])
    )
    print(
        f"\nchosen: weight {weight}, gate {gate}, scale {'on' if scale else 'off'}: "
        f"{mean:+.4f} (fused for {fused_for[gate]}/{len(strengths)} queries)"
    )
    for depth in DEPTHS:
        scores = per_query(captured[depth], relevant, weight, gate, rrf_k, scale)
        print("  " + paired(f"depth {depth}", hybrid, scores))


def evaluate(captured, queries, relevant, collection, rrf_k) -> None:
    hybrid = [ndcg(entry[0], rel) for entry, rel in zip(captured[0], relevant, strict=True)]
    mean, low, high = bootstrap_interval(hybrid)
    print(f"hybrid: nDCG@10 {mean:.4f} (95% CI {low:.4f} .. {high:.4f}) over {len(hybrid)} queries")
    weight, gate = graph_number("WEIGHT"), graph_number("MIN_MATCH_SCORE")
    for depth in DEPTHS:
        before = per_query(captured[depth], relevant, 1.0, 0.0, rrf_k)
        print(paired(f"hybrid+graph depth {depth}, weight 1, no gate (before)", hybrid, before))
        # The configured defaults, end to end through rag.search (timed), checked against the
        # offline fusion of the captured lists. Each graph search runs right after the same
        # plain hybrid one, so that both p50s see the same load on a shared machine.
        scores, timings, plain_timings, differ = [], [], [], 0
        offline = per_query(captured[depth], relevant, weight, gate, rrf_k)
        skipped = sum(
            entry[2].strength < gate or not entry[2].entities for entry in captured[depth]
        )
        for text, rel, expected in zip(queries.values(), relevant, offline, strict=True):
            begin = time.perf_counter()
            rag.search(text, collection=collection, mode="hybrid", limit=100)
            plain_timings.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            hits = rag.search(
                text, collection=collection, mode="hybrid", limit=100, graph=True,
                graph_depth=depth,
            )  # fmt: skip
            timings.append(time.perf_counter() - begin)
            scores.append(ndcg(hits, rel))
            differ += abs(scores[-1] - expected) > 1e-9
        print(
            paired(f"hybrid+graph depth {depth}, weight {weight:g}, gate {gate:g}", hybrid, scores)
            + f"; graph list skipped for {skipped}/{len(scores)} queries; "
            f"p50 {1000 * statistics.median(timings):.1f} ms "
            f"(hybrid alone, interleaved: {1000 * statistics.median(plain_timings):.1f} ms)"
            + (f"; {differ} queries differ from the offline fusion" if differ else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--split", choices=sorted(COLLECTIONS), default="test")
    parser.add_argument("--sample-docs", type=int, default=600)
    parser.add_argument(
        "--queries", type=int, default=300, help="train: how many queries to draw (seeded)"
    )
    parser.add_argument(
        "--extractor", choices=["capitalized", "ner", "spacy", "llm"], default="capitalized"
    )
    parser.add_argument(
        "--ner-model", help="NER model or spaCy pipeline name or path (--extractor ner|spacy)"
    )
    parser.add_argument("--sweep", action="store_true", help="grid of weights and gates")
    parser.add_argument("--no-build", action="store_true", help="keep the stored graph")
    parser.add_argument("--dump", help="also write the captured lists to this pickle file")
    parser.add_argument("--llm", help="--extractor llm: a litellm model string, e.g. openai/local")
    parser.add_argument("--api-base", help="--extractor llm: the model's OpenAI-compatible URL")
    args = parser.parse_args()
    if args.llm:
        # The extractor reads DJANGO_RAG["LLM"]; generous timeouts for a slow local model.
        spec = {"model": args.llm, "api_base": args.api_base, "timeout": 900, "max_retries": 1}
        override_settings(DJANGO_RAG={"LLM": spec, "LLM_DEADLINE": 900}).enable()
    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    corpus, queries, qrels = load(Path(args.data), args.split)
    if args.split == "train":
        chosen = sorted(rng.sample(sorted(queries), min(args.queries, len(queries))))
        queries = {q: queries[q] for q in chosen}
        qrels = {q: qrels[q] for q in chosen}
    collection = COLLECTIONS[args.split]
    docs = sample(corpus, qrels, args.sample_docs, rng)
    if not Collection.objects.filter(name=collection).exists():
        start = time.perf_counter()
        rag.ingest_many(
            [corpus_document(d) for d in docs],
            collection=collection,
        )
        print(f"ingest: {len(docs)} documents in {time.perf_counter() - start:.0f} s")
    print(
        f"sample ({args.split}): {len(docs)} documents, "
        f"{Chunk.objects.filter(collection__name=collection).count()} chunks, "
        f"{len(queries)} queries",
        flush=True,
    )
    if not args.no_build:
        build(collection, args.extractor, args.ner_model)
    if not args.sweep:
        leiden(rng)
    judged = {d["_id"] for d in docs}
    queries = {q: t for q, t in queries.items() if set(qrels[q]) & judged}
    relevant = [qrels[q] for q in queries]
    rrf_k = graph_number("RRF_K")
    captured = capture_lists(queries, collection)
    if args.dump:
        dump(captured, queries, relevant, args.dump)
    if args.sweep:
        sweep(captured, relevant, rrf_k)
    else:
        evaluate(captured, queries, relevant, collection, rrf_k)


if __name__ == "__main__":
    main()

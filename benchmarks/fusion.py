"""Hybrid fusion methods compared on SciFact, chosen on train by cross-validation, reported on
test, and stressed where one side is made weak.

    python benchmarks/fusion.py            # after benchmarks/beir.py stored the corpus
    python benchmarks/fusion.py --pool 20  # candidate lists of 20 per side (limit 10 x 2)

For every train and test query the two candidate lists are fetched once through the library
(semantic: HNSW cosine; full-text: BM25), both scores are computed for their union, and each
fusion method is applied offline to the same candidates, so methods differ only in fusion.
The library's own ``fuse`` runs adaptive, weighted and rrf; the alternatives from the
literature are written here. Each method's parameters are chosen on the train split (the
cross-validated estimate of that choice is printed, 5 folds), then scored on the test split
and on two stressed copies of it, neither used for any choice:

- ``weak full-text``: the two rarest query terms are removed from the full-text query (a
  vocabulary mismatch: the query's distinctive words are absent from the relevant passages);
- ``weak semantic``: the query vector is mixed with a random unit vector of equal length (an
  embedder poorly suited to the domain).

A method worth making the default beats both of its parts in every column.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir import ROOT, load, metrics  # noqa: E402  (sets up Django)
from pgvector.django import CosineDistance  # noqa: E402

from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.fusion import fuse  # noqa: E402
from django_rag.models import Chunk  # noqa: E402
from django_rag.models.fulltext import parse_query, term_weights  # noqa: E402


def candidates(text, vector, pool, *, drop_rare_terms=0):
    """(chunk source ids, cosine, BM25, semantic list size, full-text list size) of the union."""
    chunks = Chunk.objects.filter(collection__name="corpus")
    parsed = parse_query(text)
    weights = term_weights(parsed.terms, counts=parsed.counts) if parsed.terms else None
    if drop_rare_terms and weights and len(weights.terms) > drop_rare_terms:
        by_frequency = sorted(zip(weights.frequencies, weights.terms, strict=True), reverse=True)
        kept = [term for _, term in by_frequency[: len(weights.terms) - drop_rare_terms]]
        parsed = parse_query(" ".join(kept))
        weights = term_weights(parsed.terms, counts=parsed.counts) if parsed.terms else None
    semantic = chunks.semantic_hits(vector, limit=pool)
    fulltext = chunks.fulltext_hits(parsed, limit=pool, weights=weights) if weights else []
    ids = {pk for pk, _ in semantic} | {pk for pk, _ in fulltext}
    rows = Chunk.objects.filter(pk__in=ids).annotate(distance=CosineDistance("embedding", vector))
    if weights:
        rows = rows.with_bm25(weights, weights.boosts(parsed))
        values = rows.values_list("document__source_id", "distance", "fulltext_score")
    else:
        values = [(s, d, 0.0) for s, d in rows.values_list("document__source_id", "distance")]
    return [(source, 1.0 - float(distance), float(bm25)) for source, distance, bm25 in values]


# --- fusion methods: (cosines, bm25s, pool) -> scores ------------------------------------------


def library(fusion, **options):
    def method(cosines, bm25s, pool):
        items = [
            SimpleNamespace(i=i, semantic_score=s, fulltext_score=f)
            for i, (s, f) in enumerate(zip(cosines, bm25s, strict=True))
        ]
        fused = fuse(items, fusion=fusion, pool=pool, **options)
        scores = np.zeros(len(items))
        for rank, item in enumerate(fused):
            scores[item.i] = -rank
        return scores

    return method


def own_lists(cosines, bm25s, pool):
    semantic = np.sort(cosines)[::-1][:pool]
    fulltext = np.sort(bm25s[bm25s > 0])[::-1][:pool]
    return semantic, fulltext


def standard(values, reference):
    spread = reference.std() if len(reference) > 1 else 0.0
    return (values - reference.mean()) / spread if spread > 0 else np.zeros_like(values)


def zscore(weight):
    """Fixed-weight sum of standard scores (each side against its own list)."""

    def method(cosines, bm25s, pool):
        semantic, fulltext = own_lists(cosines, bm25s, pool)
        if not len(fulltext):
            return cosines
        return weight * standard(cosines, semantic) + (1 - weight) * standard(bm25s, fulltext)

    return method


def dbsf(weight):
    """Distribution-based score fusion: each side scaled by mean +- 3 std of its own list."""

    def scaled(values, reference):
        low, high = reference.mean() - 3 * reference.std(), reference.mean() + 3 * reference.std()
        return (values - low) / (high - low) if high > low else np.zeros_like(values)

    def method(cosines, bm25s, pool):
        semantic, fulltext = own_lists(cosines, bm25s, pool)
        if not len(fulltext):
            return cosines
        return weight * scaled(cosines, semantic) + (1 - weight) * scaled(bm25s, fulltext)

    return method


def tm2c2(weight):
    """Convex combination over theoretical min-max (0 .. the list's best), Bruch et al. 2023."""

    def method(cosines, bm25s, pool):
        semantic, fulltext = own_lists(cosines, bm25s, pool)
        f = bm25s / fulltext[0] if len(fulltext) else np.zeros_like(bm25s)
        return weight * cosines / max(semantic[0], 1e-9) + (1 - weight) * f

    return method


METHODS = {
    "adaptive (library)": [
        (f"prior {w}/{1 - w:.1f}", library("adaptive", semantic_weight=w, fulltext_weight=1 - w))
        for w in (0.5, 0.6, 0.7, 0.8)
    ],
    "weighted (library, fixed)": [
        (f"{w}/{1 - w:.1f}", library("weighted", semantic_weight=w, fulltext_weight=1 - w))
        for w in (0.5, 0.6, 0.7)
    ],
    "rrf (library)": [(f"k={k}", library("rrf", rrf_k=k)) for k in (10, 30, 60)],
    "z-score, fixed weights": [(f"{w}/{1 - w:.1f}", zscore(w)) for w in (0.5, 0.6, 0.7)],
    "DBSF": [(f"{w}/{1 - w:.1f}", dbsf(w)) for w in (0.5, 0.6, 0.7)],
    "TM2C2": [(f"{w}/{1 - w:.1f}", tm2c2(w)) for w in (0.5, 0.6, 0.7, 0.8)],
}


def ndcg_of(method, query, pool):
    sources, cosines, bm25s = query["sources"], query["cosines"], query["bm25s"]
    scores = method(cosines, bm25s, pool)
    order = np.lexsort((-cosines, -scores))
    ranked = list(dict.fromkeys(sources[i] for i in order))
    return metrics(ranked, query["relevant"])["nDCG@10"]


def side(query, which):
    key = "cosines" if which == "semantic" else "bm25s"
    order = np.argsort(-query[key], kind="stable")
    order = [i for i in order if which == "semantic" or query["bm25s"][i] > 0]
    ranked = list(dict.fromkeys(query["sources"][i] for i in order))
    return metrics(ranked, query["relevant"])["nDCG@10"]


def collect(data, split, embedder, pool, stress=None):
    _, queries, qrels = load(data, split)
    out = []
    for qid, text in queries.items():
        vector = np.asarray(embedder.embed_query(text), dtype=float)
        if stress == "semantic":
            noise = np.random.default_rng(int(qid)).normal(size=len(vector))
            vector = vector + noise / np.linalg.norm(noise)
            vector /= np.linalg.norm(vector)
        rows = candidates(
            text, vector.tolist(), pool, drop_rare_terms=2 if stress == "fulltext" else 0
        )
        out.append(
            {
                "sources": [r[0] for r in rows],
                "cosines": np.array([r[1] for r in rows]),
                "bm25s": np.array([r[2] for r in rows]),
                "relevant": qrels[qid],
            }
        )
    return out


def cross_validated(per_option, folds=5, seed=0):
    n = len(per_option[0])
    fold_of = [random.Random(seed + i).randrange(folds) for i in range(n)]
    held = [0.0] * n
    for fold in range(folds):
        inside = [i for i in range(n) if fold_of[i] != fold]
        best = max(range(len(per_option)), key=lambda o: sum(per_option[o][i] for i in inside))
        for i in range(n):
            if fold_of[i] == fold:
                held[i] = per_option[best][i]
    return statistics.fmean(held)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--pool", type=int, default=20, help="candidates per side")
    args = parser.parse_args()
    embedder = get_embedder()
    sets = {
        "train": collect(args.data, "train", embedder, args.pool),
        "test": collect(args.data, "test", embedder, args.pool),
        "weak full-text": collect(args.data, "test", embedder, args.pool, stress="fulltext"),
        "weak semantic": collect(args.data, "test", embedder, args.pool, stress="semantic"),
    }
    print(f"{args.data.name}: {len(sets['train'])} train, {len(sets['test'])} test queries; "
          f"{args.pool} candidates per side\n")  # fmt: skip
    columns = ["train (CV)", "test", "weak full-text", "weak semantic"]
    print("| method | chosen on train | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for part in ("semantic", "fulltext"):
        cells = [statistics.fmean(side(q, part) for q in sets[name]) for name in sets]
        print(f"| {part} alone | | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    for name, options in METHODS.items():
        train = [[ndcg_of(m, q, args.pool) for q in sets["train"]] for _, m in options]
        best = max(range(len(options)), key=lambda o: statistics.fmean(train[o]))
        label, method = options[best]
        cells = [cross_validated(train)] + [
            statistics.fmean(ndcg_of(method, q, args.pool) for q in sets[s])
            for s in ("test", "weak full-text", "weak semantic")
        ]
        print(f"| {name} | {label} | " + " | ".join(f"{c:.4f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""BM25 query-term frequency (issue 28, item 6): ``SEARCH["BM25_K3"]`` chosen on train splits,
reported on test splits, for short and for long queries.

    python benchmarks/query_tf.py                    # ingest (first run), sweep, report
    python benchmarks/query_tf.py --reuse            # search what a previous run stored
    python benchmarks/query_tf.py --reuse --k3 0,1,2,None --report-k3 1

Query sets (nDCG@10 of the gold documents; a document counts when any of its chunks is found):

- SciFact train / test: the claims (about 12 words, a repeated word is rare) over the corpus as
  it is (collection ``scifact``).
- Inverse cloze train / test (paragraph-length queries): for each gold abstract of a train
  (test) claim with at least 4 sentences, the query is the first half of its sentences and the
  indexed document keeps its title and only the second half (collection ``cloze``: the corpus
  with those documents cut, nothing else changed). Abstracts gold for both a train and a test
  claim go to the test set only, so the two sets share no document.

k3 is swept on the two train sets only; the k3 with the highest mean nDCG@10 over the four
train cells (SciFact train and cloze train, full-text and hybrid) is chosen, and the test sets
report k3 = 0 (each word once: the behaviour before this setting), the chosen k3 and None
(raw counts, as Lucene and bm25s score) untuned, with paired bootstrap 95% intervals of the
differences. The full-text backend is ``"sql"`` (the setting applies to it only).

It uses a private database (DJANGO_RAG_BENCHMARK_DB, default ``<tmp>/django_rag_bench_qtf``)
and the bundled MiniLM; document vectors are embedded once (the cut documents' texts are new).
Timings are not reported: the ranking is what changes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault(
    "DJANGO_RAG_BENCHMARK_DB", str(Path(tempfile.gettempdir()) / "django_rag_bench_qtf")
)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir import ROOT, CachedQueries, load, metrics  # noqa: E402  (sets up Django)
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conf import max_query_terms  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, paired_difference  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")
MODES = ("fulltext", "hybrid")
MIN_SENTENCES = 4
MAX_QUERY_TERMS: int | None | str = "default"  # --max-query-terms


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def inverse_cloze(corpus, train_qrels, test_qrels, limit: int | None, seed: int = 13):
    """(cut texts by doc id, train set, test set); a set is (queries, qrels) keyed by doc id."""
    by_id = {doc["_id"]: doc for doc in corpus}
    test_gold = {d for rel in test_qrels.values() for d in rel if d in by_id}
    train_gold = {d for rel in train_qrels.values() for d in rel if d in by_id} - test_gold
    cut: dict[str, str] = {}
    sets = []
    for gold in (train_gold, test_gold):
        usable = [d for d in sorted(gold) if len(sentences(by_id[d]["text"])) >= MIN_SENTENCES]
        if limit is not None and len(usable) > limit:
            usable = sorted(random.Random(seed).sample(usable, limit))
        queries, qrels = {}, {}
        for doc_id in usable:
            parts = sentences(by_id[doc_id]["text"])
            half = len(parts) // 2
            queries[f"cloze-{doc_id}"] = " ".join(parts[:half])
            qrels[f"cloze-{doc_id}"] = {doc_id: 1}
            cut[doc_id] = " ".join(parts[half:])
        sets.append((queries, qrels))
    return cut, sets[0], sets[1]


def cache_document_vectors(embedder) -> None:
    """Embed each distinct chunk text once across both collections (most are the same)."""
    cache: dict[str, list[float]] = {}
    inner = embedder.embed_documents

    def embed_documents(texts):
        missing = [t for t in dict.fromkeys(texts) if t not in cache]
        if missing:
            cache.update(zip(missing, inner(missing), strict=True))
        return [cache[t] for t in texts]

    embedder.embed_documents = embed_documents


def ingest(corpus, cut) -> None:
    Chunk.objects.all().delete()
    Document.objects.all().delete()
    Collection.objects.all().delete()
    for name, texts in (("scifact", {}), ("cloze", cut)):
        start = time.perf_counter()
        rag.ingest_many(
            (
                corpus_document({**doc, "text": texts.get(doc["_id"], doc["text"])})
                for doc in corpus
            ),
            collection=name,
        )
        print(f"ingested {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def parse_k3(text: str) -> float | None:
    return None if text.strip() == "None" else float(text)


def label(k3: float | None) -> str:
    return "None (raw count)" if k3 is None else f"{k3:g}"


def run(queries, qrels, cached, collection: str, k3, mode: str, limit: int) -> list[float]:
    search = {**settings.DJANGO_RAG.get("SEARCH", {}), "BM25_K3": k3, "FULLTEXT_BACKEND": "sql"}
    if MAX_QUERY_TERMS != "default":
        search["MAX_QUERY_TERMS"] = MAX_QUERY_TERMS
    scores = []
    with override_settings(DJANGO_RAG={**settings.DJANGO_RAG, "SEARCH": search}):
        for qid, text in queries.items():
            results = rag.search(
                text, mode=mode, collection=collection, limit=limit, embedder=cached
            )
            ranked = list(dict.fromkeys(r.source_id for r in results))
            scores.append(metrics(ranked, qrels[qid])["nDCG@10"])
    return scores


def table(name: str, count: int, words: float, per_k3: dict, baseline) -> None:
    print(f"\n{name}: {count} queries, {words:.0f} words on average\n")
    print(
        "| k3 | full-text nDCG@10 | vs k3 = 0 (95% interval) | hybrid nDCG@10 | "
        "vs k3 = 0 (95% interval) |\n|---|---|---|---|---|"
    )
    for k3, cells in per_k3.items():
        row = [label(k3)]
        for mode in MODES:
            row.append(f"{statistics.fmean(cells[mode]):.4f}")
            if k3 == baseline:
                row.append("")
            else:
                delta, low, high = paired_difference(per_k3[baseline][mode], cells[mode])
                row.append(f"{delta:+.4f} ({low:+.4f} .. {high:+.4f})")
        print("| " + " | ".join(row) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--reuse", action="store_true", help="skip ingest; use the stored corpus")
    parser.add_argument("--k3", default="0,0.5,1,2,4,8,None", help="values swept on train")
    parser.add_argument("--report-k3", default=None, help="skip choosing: report this k3 on test")
    parser.add_argument("--cloze-max", type=int, default=500, help="most queries per cloze set")
    parser.add_argument("--limit", type=int, default=10, help="results per search (default 10)")
    parser.add_argument("--out", type=Path, help="write the per-query nDCG@10 here (JSON)")
    parser.add_argument(
        "--max-query-terms",
        default="default",
        help="SEARCH['MAX_QUERY_TERMS'] for every search: an integer or None (default: as set)",
    )
    parser.add_argument(
        "--sets",
        default=None,
        help="with --report-k3: the query sets reported, by part of their names (default: the "
        "test sets; 'cloze' gives both cloze sets)",
    )
    args = parser.parse_args()
    global MAX_QUERY_TERMS
    if args.max_query_terms != "default":
        MAX_QUERY_TERMS = None if args.max_query_terms == "None" else int(args.max_query_terms)

    corpus, train_queries, train_qrels = load(args.data, "train")
    _, test_queries, test_qrels = load(args.data, "test")
    cut, cloze_train, cloze_test = inverse_cloze(corpus, train_qrels, test_qrels, args.cloze_max)
    call_command("migrate", verbosity=0)
    embedder = get_embedder()
    stored = {
        name: Document.objects.filter(collection__name=name).count()
        for name in ("scifact", "cloze")
    }
    if not (args.reuse and all(n == len(corpus) for n in stored.values())):
        cache_document_vectors(embedder)
        ingest(corpus, cut)
    sets = {
        "SciFact train": (train_queries, train_qrels, "scifact"),
        "inverse cloze train": (*cloze_train, "cloze"),
        "SciFact test": (test_queries, test_qrels, "scifact"),
        "inverse cloze test": (*cloze_test, "cloze"),
    }
    vectors = {
        text: embedder.embed_query(text)
        for queries, _, _ in sets.values()
        for text in queries.values()
    }
    cached = CachedQueries(embedder, vectors)

    print(f"## BM25 query-term frequency ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `python benchmarks/query_tf.py {' '.join(sys.argv[1:])}`")
    chunks = {n: Chunk.objects.filter(collection__name=n).count() for n in ("scifact", "cloze")}
    print(
        f"- {args.data.name}: {len(corpus)} documents; collection `scifact` {chunks['scifact']} "
        f"chunks, `cloze` {chunks['cloze']} chunks ({len(cut)} abstracts cut); limit "
        f"{args.limit}; MAX_QUERY_TERMS "
        f"{max_query_terms() if MAX_QUERY_TERMS == 'default' else MAX_QUERY_TERMS}"
    )
    results: dict[str, dict] = {}
    sweep = [parse_k3(v) for v in args.k3.split(",")]
    baseline = 0.0
    if baseline not in sweep:
        sweep.insert(0, baseline)

    def evaluate(name: str, values) -> None:
        queries, qrels, collection = sets[name]
        per_k3 = results.setdefault(name, {})
        for k3 in values:
            if k3 not in per_k3:
                per_k3[k3] = {
                    mode: run(queries, qrels, cached, collection, k3, mode, args.limit)
                    for mode in MODES
                }
        words = statistics.fmean(len(q.split()) for q in queries.values())
        table(name, len(queries), words, {k: per_k3[k] for k in values}, baseline)

    if args.report_k3 is None:
        for name in ("SciFact train", "inverse cloze train"):
            evaluate(name, sweep)

        def train_mean(k3) -> float:
            return statistics.fmean(
                statistics.fmean(results[name][k3][mode])
                for name in ("SciFact train", "inverse cloze train")
                for mode in MODES
            )

        chosen = max(sweep, key=lambda k3: (train_mean(k3), k3 == baseline))
        print(
            f"\nChosen on train (highest mean nDCG@10 of the four train cells): k3 = "
            f"{label(chosen)} ({train_mean(chosen):.4f}; k3 = 0: {train_mean(baseline):.4f})"
        )
    else:
        chosen = parse_k3(args.report_k3)
    report = list(dict.fromkeys([baseline, chosen, None]))
    reported = ["SciFact test", "inverse cloze test"]
    if args.sets:  # e.g. "cloze" for both cloze sets
        reported = [n for n in sets if any(part in n for part in args.sets.split(","))]
    for name in reported:
        evaluate(name, report)
    for name, per_k3 in results.items():
        for k3, cells in per_k3.items():
            for mode in MODES:
                _, low, high = bootstrap_interval(cells[mode])
                print(
                    f"- {name}, k3 {label(k3)}, {mode}: nDCG@10 {statistics.fmean(cells[mode]):.4f} "
                    f"({low:.4f} .. {high:.4f})"
                )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    name: {label(k3): cells for k3, cells in per_k3.items()}
                    for name, per_k3 in results.items()
                }
            )
        )


if __name__ == "__main__":
    main()

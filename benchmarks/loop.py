"""The Loop agent's harness against plain hybrid search, on BEIR SciFact test queries.

    python benchmarks/beir.py                 # once: stores the corpus in the benchmark database
    python benchmarks/loop.py                 # then this (SciFact from ../shared/data/scifact)
    python benchmarks/loop.py --data PATH --split test --queries 100

A scripted controller (no real model) issues the question itself as its first search (limit
10) and then answers. The sources the loop hands back must then rank the documents exactly as
``rag.search(question, mode="hybrid", limit=10)`` does: same nDCG@10, query by query. A gap
means the loop loses, reorders or duplicates chunks between the search tool and its result.
It also reports what the harness adds to a search (the controller answers at once, so this is
the loop's own cost: tool dispatch, numbering, prompts, telemetry).

It reads the corpus a ``beir.py`` run stored (collection ``corpus``) in the benchmark database
(``DJANGO_RAG_BENCHMARK_DB``, see benchmarks/settings.py); it migrates that database and
otherwise only reads it.
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

from django.core.management import call_command  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import CachedQueries, load, metrics, percentile  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.evaluation.metrics import paired_difference  # noqa: E402
from django_rag.models import Document  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402

LIMIT = 10


def controller(messages):
    """Search the question first (limit 10), then answer citing the first source."""
    if not any(message["role"] == "tool" for message in messages):
        question = next(m["content"] for m in messages if m["role"] == "user")
        return ("search", {"query": question, "limit": LIMIT})
    return ("answer", {"text": "The first source is the most relevant [1]."})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--queries", type=int, default=None, help="only the first N queries")
    args = parser.parse_args()

    corpus, queries, qrels = load(args.data, args.split)
    call_command("migrate", verbosity=0)
    stored = Document.objects.filter(collection__name="corpus").count()
    if stored != len(corpus):
        sys.exit(
            f"The benchmark database holds {stored} documents in collection 'corpus', not the "
            f"{len(corpus)} of {args.data}: run `python benchmarks/beir.py` first."
        )
    if args.queries:
        queries = dict(list(queries.items())[: args.queries])
    embedder = get_embedder()
    cached = CachedQueries(
        embedder, {text: embedder.embed_query(text) for text in queries.values()}
    )

    search_ndcg, loop_ndcg, search_ms, loop_ms = [], [], [], []
    identical = 0
    statuses: dict[str, int] = {}
    for qid, text in queries.items():
        start = time.perf_counter()
        hits = rag.search(text, collection="corpus", mode="hybrid", limit=LIMIT, embedder=cached)
        search_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        result = rag.Loop(
            text,
            collection="corpus",
            llm=ScriptedLLM(default=controller),
            limit=LIMIT,
            max_chunks=LIMIT,
            mode="hybrid",
            embedder=cached,
        ).run()
        loop_ms.append((time.perf_counter() - start) * 1000)
        statuses[result.stop_reason] = statuses.get(result.stop_reason, 0) + 1
        ranked_search = list(dict.fromkeys(hit.source_id for hit in hits))
        ranked_loop = list(dict.fromkeys(chunk.source_id for chunk in result.chunks))
        identical += ranked_search == ranked_loop
        search_ndcg.append(metrics(ranked_search, qrels[qid])["nDCG@10"])
        loop_ndcg.append(metrics(ranked_loop, qrels[qid])["nDCG@10"])

    delta, low, high = paired_difference(search_ndcg, loop_ndcg)
    print(f"## Loop harness on {args.data.name} ({time.strftime('%Y-%m-%d', time.gmtime())})\n")
    print(f"- Command: `{' '.join(['python benchmarks/loop.py', *sys.argv[1:]])}`")
    print(
        f"- {len(queries)} {args.split} queries; {len(corpus)} documents stored; controller: "
        f"scripted (search the question, limit {LIMIT}, then answer); embedder "
        f"{embedder.model_name} with query vectors computed beforehand"
    )
    print(f"- Load average before: {LOAD_BEFORE}; after: {open('/proc/loadavg').read().strip()}\n")
    print("| retrieval | nDCG@10 | p50 | p95 |")
    print("|---|---|---|---|")
    print(
        f'| `rag.search(mode="hybrid", limit=10)` | {statistics.mean(search_ndcg):.4f} | '
        f"{percentile(search_ms, 50):.1f} ms | {percentile(search_ms, 95):.1f} ms |"
    )
    print(
        f"| `rag.Loop(...).run()`, scripted controller | {statistics.mean(loop_ndcg):.4f} | "
        f"{percentile(loop_ms, 50):.1f} ms | {percentile(loop_ms, 95):.1f} ms |"
    )
    print(
        f"\nSame ranked documents for {identical} of {len(queries)} queries; loop - search "
        f"nDCG@10 {delta:+.4f} (95% bootstrap interval {low:+.4f} .. {high:+.4f}); stop "
        f"reasons: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}."
    )


LOAD_BEFORE = open("/proc/loadavg").read().strip()

if __name__ == "__main__":
    main()

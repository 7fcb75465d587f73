"""The grounders' agreement with SciFact's own claim labels.

    python benchmarks/grounding.py                       # SciFact from ../shared/data/scifact
    python benchmarks/grounding.py --per-class 40 --grounder embedding --seed 0
    python benchmarks/grounding.py --grounder cross-encoder --model PATH_OR_NAME

The labelled set is built from SciFact's claims (queries.jsonl keeps each claim's evidence:
the abstract and its SUPPORT or CONTRADICT label). Each item is one claim (the "answer
sentence") and one abstract, split into sentences that become the chunks:

- ``supported``: a claim with an abstract labelled SUPPORT;
- ``contradicted``: a claim with an abstract labelled CONTRADICT;
- ``unsupported``: a claim with a random abstract that is not evidence for it.

``--per-class`` items of each label are drawn (seeded) from the train claims to choose the
threshold (the one with the best accuracy) and as many from the test claims to measure it.
Accuracy is binary: the grounder's verdict is right when it says "supported" exactly for the
supported items (contradicted and unsupported items must not be called supported). The
three-way rate (contradicted called contradicted) is reported for grounders that can say so.

The LLM judge needs a real model; none is reachable from the benchmark machine, so it is not
measured here (``--grounder llm`` runs it with ``DJANGO_RAG["LLM"]`` when one is configured).
No settings or database are needed for the local grounders.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_rag"],
        DATABASES={},
        DJANGO_RAG={"LLM": os.environ.get("DJANGO_RAG_BENCHMARK_LLM")},
        USE_TZ=True,
    )
    django.setup()

from django_rag.answers.grounding import (  # noqa: E402
    CrossEncoderGrounder,
    EmbeddingGrounder,
    LLMGrounder,
    split_sentences,
)
from django_rag.results import SearchResult  # noqa: E402

LABELS = ("supported", "contradicted", "unsupported")


def load_items(data: Path, per_class: int, seed: int) -> dict[str, list[dict]]:
    """{"train": [...], "test": [...]}: ``per_class`` items of each label per split."""
    corpus = {}
    with open(data / "corpus.jsonl") as handle:
        for line in handle:
            doc = json.loads(line)
            corpus[doc["_id"]] = (doc["title"].strip() + ". " + doc["text"]).strip()
    with open(data / "qrels" / "test.tsv") as handle:
        test_ids = {line.split("\t")[0] for line in handle.read().splitlines()[1:]}
    rng = random.Random(seed)
    doc_ids = sorted(corpus)
    pools: dict[str, dict[str, list[dict]]] = {
        split: {label: [] for label in LABELS} for split in ("train", "test")
    }
    with open(data / "queries.jsonl") as handle:
        for line in handle:
            query = json.loads(line)
            split = "test" if query["_id"] in test_ids else "train"
            evidence = query["metadata"] or {}
            for doc_id, entries in sorted(evidence.items()):
                label = entries[0]["label"]
                if doc_id in corpus and label in ("SUPPORT", "CONTRADICT"):
                    name = "supported" if label == "SUPPORT" else "contradicted"
                    pools[split][name].append(
                        {"claim": query["text"], "doc": doc_id, "label": name}
                    )
            if evidence:
                other = rng.choice(doc_ids)
                while other in evidence:
                    other = rng.choice(doc_ids)
                pools[split]["unsupported"].append(
                    {"claim": query["text"], "doc": other, "label": "unsupported"}
                )
    items = {}
    for split, by_label in pools.items():
        chosen = []
        for label in LABELS:
            pool = sorted(by_label[label], key=lambda item: (item["claim"], item["doc"]))
            chosen += rng.sample(pool, min(per_class, len(pool)))
        for item in chosen:
            text = corpus[item["doc"]]
            item["chunks"] = [
                SearchResult(chunk_id=f"{item['doc']}:{i}", text=text[a:b], score=0.0)
                for i, (a, b) in enumerate(split_sentences(text))
            ]
        items[split] = chosen
    return items


def scores(grounder, items: list[dict]) -> list[tuple[str, float | None, str]]:
    """(label, the grounder's best support score, its verdict) per item."""
    out = []
    for item in items:
        grounding = grounder.ground(item["claim"], item["chunks"])
        span = grounding.spans[0] if grounding.spans else None
        out.append(
            (
                item["label"],
                None if span is None else span.score,
                "unsupported" if span is None else span.verdict,
            )
        )
    return out


def accuracy(rows, threshold: float | None = None) -> dict[str, float]:
    def verdict(score, given):
        if threshold is None:
            return given
        return "supported" if score is not None and score >= threshold else "unsupported"

    right = {label: 0 for label in LABELS}
    total = {label: 0 for label in LABELS}
    contradicted = 0
    for label, score, given in rows:
        said = verdict(score, given)
        total[label] += 1
        right[label] += (said == "supported") == (label == "supported")
        contradicted += label == "contradicted" and said == "contradicted"
    n = sum(total.values())
    return {
        "accuracy": sum(right.values()) / n,
        **{f"{label}_right": right[label] / max(1, total[label]) for label in LABELS},
        "contradiction_recall": contradicted / max(1, total["contradicted"]),
        "items": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--grounder", choices=["embedding", "cross-encoder", "llm"],
                        default="embedding")  # fmt: skip
    parser.add_argument("--model", default=None, help="embedder spec or CrossEncoder model")
    args = parser.parse_args()

    import torch

    # One thread: on a shared, loaded machine more threads contend and run several times slower.
    torch.set_num_threads(args.threads)
    items = load_items(args.data, args.per_class, args.seed)
    if args.grounder == "embedding":
        from django_rag.embeddings import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(**({"model": args.model} if args.model else {}))
        grounder = EmbeddingGrounder(embedder=embedder, threshold=0.0)
    elif args.grounder == "cross-encoder":
        grounder = CrossEncoderGrounder(model=args.model or "cross-encoder/nli-deberta-v3-xsmall")
    else:
        grounder = LLMGrounder()
    print(f"grounder: {grounder.name}; items per split: "
          f"{ {split: len(rows) for split, rows in items.items()} }")  # fmt: skip

    started = time.perf_counter()
    train = scores(grounder, items["train"])
    test = scores(grounder, items["test"])
    elapsed = time.perf_counter() - started

    if args.grounder == "embedding":
        # Choose the similarity threshold on the train items, measure on the test items.
        candidates = sorted({round(s, 3) for _, s, _ in train if s is not None})
        best = max(candidates, key=lambda t: accuracy(train, t)["accuracy"])
        print(f"threshold chosen on train: {best:.3f} "
              f"(train accuracy {accuracy(train, best)['accuracy']:.3f})")  # fmt: skip
        result = accuracy(test, best)
    else:
        result = accuracy(test)
    print(f"test: {json.dumps({k: round(v, 4) for k, v in result.items()})}")
    print(f"time: {elapsed:.1f}s for {len(train) + len(test)} items")


if __name__ == "__main__":
    main()

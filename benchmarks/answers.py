"""Answer quality on multi-hop questions (docs/benchmarks.md#answer-quality), against any
OpenAI-compatible endpoint or litellm model.

    python benchmarks/local_llm.py serve --port 8765 &          # or a hosted model
    python benchmarks/answers.py --model openai/local --api-base http://127.0.0.1:8765/v1 \\
        [--data ../shared/data/hotpotqa_dev200] [--questions 40] \\
        [--configs ask,ask+rerank,agent,loop] [--graph] [--out answers.jsonl]

Each configuration answers the first ``--questions`` questions of the set (the corpus, 1,947
paragraphs, is stored once in collection ``hotpot`` of the benchmark database); per answer:

- exact match, token F1 (SQuAD normalisation, best over the gold answers; citation markers
  removed) and "contains" (the normalised gold answer appears in the answer);
- citation precision and recall against the gold paragraphs (distinct cited paragraphs);
- faithfulness: the share of the answer's sentences the grounder (``--grounder``, default the
  embedding grounder, which needs no LLM) finds supported by the answer's own chunks;
- latency and LLM tokens per answer;
- fallbacks: which steps noted a fallback in their warnings (the agent's ``step: ...``
  warnings, the Loop's, ``ask``'s), counted per step.

Means come with 95% bootstrap intervals, and every configuration is paired with ``ask``
(the same questions). Rows are appended to ``--out`` as they are made, so a stopped run
resumes where it stopped. ``--graph`` adds each configuration with ``graph=True`` (build
the graph first: ``python benchmarks/graph_hotpot.py --extractor ner``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import string
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import load  # noqa: E402
from django_rag.answers.grounding import get_grounder  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, paired_difference  # noqa: E402
from django_rag.models import Document  # noqa: E402

COLLECTION = "hotpot"
CONFIGS = ("ask", "ask+rerank", "agent", "loop")
METRICS = ("EM", "F1", "contains", "cite_P", "cite_R", "faithful", "seconds", "tokens")


# --- scoring -----------------------------------------------------------------------------------

_CITATION = re.compile(r"\[\d+(?:\s*,\s*\d+)*\]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = _CITATION.sub(" ", text.lower()).translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def answer_scores(text: str, golds: list[str]) -> dict[str, float]:
    answer = normalize(text)
    return {
        "EM": max(float(answer == normalize(g)) for g in golds),
        "F1": max(token_f1(text, g) for g in golds),
        "contains": max(float(bool(normalize(g)) and normalize(g) in answer) for g in golds),
    }


def citation_scores(cited: set[str], gold: set[str]) -> dict[str, float]:
    hits = len(cited & gold)
    return {
        "cite_P": hits / len(cited) if cited else 0.0,
        "cite_R": hits / len(gold) if gold else 0.0,
    }


#: Fallbacks that are logged rather than returned (the message's start -> the step).
LOGGED_FALLBACKS = {
    "LLM reranker": "rerank",
    "django_rag agent step": "agent step",
}
LOOP_FALLBACKS = {
    "the model answered in text": "loop: answered in text, not with the answer tool",
    "the model asked for": "loop: too many tool calls in one reply",
    "the model answered before searching": "loop: answered before searching (sent back)",
    "the model repeated a search": "loop: repeated a search",
}


def fallbacks(warnings: list[str]) -> list[str]:
    """The steps that noted a fallback: the agent's warnings start ``step: ...``; the Loop's
    and the logged ones are named from their text."""
    steps = []
    for warning in warnings:
        for start, step in (LOGGED_FALLBACKS | LOOP_FALLBACKS).items():
            if warning.startswith(start):
                steps.append(step)
                break
        else:
            head = warning.split(":", 1)[0].strip()
            steps.append(head if head.isidentifier() and len(head) < 20 else "other")
    return steps


class LoggedWarnings(logging.Handler):
    """Collects django_rag's warnings while one answer is made (the LLM reranker logs a batch
    it could not parse instead of returning a warning)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if any(message.startswith(start) for start in LOGGED_FALLBACKS):
            self.messages.append(message)

    def __enter__(self):
        logging.getLogger("django_rag").addHandler(self)
        logging.getLogger("django_rag").setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        logging.getLogger("django_rag").removeHandler(self)


# --- the configurations ------------------------------------------------------------------------


def run_config(name: str, question: str, graph: bool):
    """(answer text, chunks, citations' chunks, warnings) for one configuration."""
    options = {"collection": COLLECTION, "mode": "hybrid", "limit": 5}
    if graph:
        options["graph"] = True
    if name == "ask":
        answer = rag.ask(question, **options)
        return answer, list(answer.warnings)
    if name == "ask+rerank":
        answer = rag.ask(question, reranker="llm", **options)
        return answer, list(answer.warnings)
    if name == "agent":
        agent = (
            rag.Agent(question, **{k: v for k, v in options.items()})
            .decompose()
            .search()
            .reason()
            .answer()
        )
        ctx = agent.context
        if ctx.error is not None:
            raise ctx.error
        return agent.result, list(ctx.warnings)
    if name == "loop":
        result = rag.Loop(question, max_iterations=5, **options).run()
        warnings = list(result.warnings)
        if result.error is not None:
            warnings.append(f"loop: {type(result.error).__name__}")
        return result, warnings
    raise SystemExit(f"unknown configuration {name!r}; choose from {', '.join(CONFIGS)}")


def measure(name, qid, question, golds, gold_docs, graph, grounder, doc_ids):
    start = time.perf_counter()
    error = None
    try:
        with rag_usage() as usage, LoggedWarnings() as logged:
            answer, warnings = run_config(name, question, graph)
        # The agent's step fallbacks are in its warnings already; keep the logged ones that
        # are not (the reranker's).
        warnings += [m for m in logged.messages if not m.startswith("django_rag agent step")]
        text = answer.text or ""
        chunks = list(answer.chunks)
        cited = {doc_ids.get(c.chunk.document_id, "") for c in answer.citations}
    except Exception as exc:  # a failed answer scores zero and is counted, never hidden
        text, chunks, cited, warnings, error = "", [], set(), [], f"{type(exc).__name__}: {exc}"
        usage = None
    seconds = time.perf_counter() - start
    row = {"config": name + (" +graph" if graph else ""), "qid": qid, "question": question}
    row |= answer_scores(text, golds) | citation_scores(cited - {""}, gold_docs)
    faithful = 0.0
    if text and chunks and grounder is not None:
        try:
            grounding = grounder.ground(text, chunks)
            spans = grounding.spans
            faithful = (
                sum(span.verdict == "supported" for span in spans) / len(spans) if spans else 0.0
            )
        except Exception as exc:
            warnings.append(f"grounder: {type(exc).__name__}")
    row |= {
        "faithful": faithful,
        "seconds": seconds,
        "tokens": float(usage.prompt_tokens + usage.completion_tokens) if usage else 0.0,
        "fallbacks": fallbacks(warnings),
        "warnings": [w[:300] for w in warnings],
        "error": error,
        "answer": text[:2000],
    }
    return row


def rag_usage():
    from django_rag.llm.base import collect_usage

    return collect_usage()


# --- corpus and report -------------------------------------------------------------------------


def ensure_corpus(corpus) -> dict:
    call_command("migrate", verbosity=0)
    stored = Document.objects.filter(collection__name=COLLECTION).count()
    if stored != len(corpus):
        Document.objects.filter(collection__name=COLLECTION).delete()
        start = time.perf_counter()
        rag.ingest_many(
            (corpus_document(doc) for doc in corpus),
            collection=COLLECTION,
        )
        print(f"stored {len(corpus)} paragraphs in {time.perf_counter() - start:.0f} s")
    return dict(Document.objects.filter(collection__name=COLLECTION).values_list("id", "source_id"))


def report(rows: list[dict], configs: list[str]) -> None:
    by_config: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_config.setdefault(row["config"], {})[row["qid"]] = row
    print(
        "| configuration | n | "
        + " | ".join(METRICS)
        + " | answers citing nothing | steps falling back | errors |\n|"
        + "---|" * (len(METRICS) + 5)
    )
    for config in configs:
        results = by_config.get(config)
        if not results:
            continue
        cells = []
        for metric in METRICS:
            mean, low, high = bootstrap_interval([r[metric] for r in results.values()])
            digits = 1 if metric in ("seconds", "tokens") else 3
            cells.append(f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]")
        steps = Counter(step for r in results.values() for step in fallbacks(r["warnings"]))
        fell = ", ".join(f"{s} {n}" for s, n in steps.most_common()) or "none"
        errors = sum(1 for r in results.values() if r["error"])
        # An answer with text and no [n] marker: the answer step's citation fallback.
        answered = [r for r in results.values() if r["answer"].strip()]
        uncited = sum(1 for r in answered if not _CITATION.search(r["answer"]))
        print(
            f"| {config} | {len(results)} | "
            + " | ".join(cells)
            + f" | {uncited}/{len(answered)} | {fell} | {errors} |"
        )
    base = by_config.get("ask", {})
    for config in configs:
        other = by_config.get(config, {})
        common = sorted(set(base) & set(other))
        if config == "ask" or not common:
            continue
        for metric in ("F1", "contains", "cite_R"):
            mean, low, high = paired_difference(
                [base[q][metric] for q in common], [other[q][metric] for q in common]
            )
            print(
                f"{config} - ask, {metric}: {mean:+.3f} [{low:+.3f}, {high:+.3f}] "
                f"({len(common)} questions)"
            )


def endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The data and endpoint options every LLM benchmark on hotpotqa_dev200 takes."""
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "data" / "hotpotqa_dev200"
    )
    parser.add_argument("--model", default="openai/local")
    parser.add_argument("--api-base", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--report-only", action="store_true")


def llm_spec(args) -> dict:
    """The LLM setting for ``--model`` at ``--api-base``: patient with a slow local model."""
    return {
        "model": args.model,
        "api_base": args.api_base,
        "api_key": args.api_key,
        "timeout": 900,
        "max_retries": 1,
        "temperature": 0.0,
    }


def dev_questions(data: Path, count: int):
    """``(queries, qrels, raw records, the first count question ids)`` of the set."""
    corpus, queries, qrels = load(data, "test")
    raw = {q["_id"]: q for q in map(json.loads, (data / "queries.jsonl").open())}
    return corpus, queries, qrels, raw, [q for q in raw if q in qrels][:count]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    endpoint_arguments(parser)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--graph", action="store_true", help="also each configuration + graph")
    parser.add_argument("--grounder", default="embedding", help="'embedding', 'nli', 'llm'")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "answers.jsonl")
    args = parser.parse_args()

    corpus, queries, qrels, raw, qids = dev_questions(args.data, args.questions)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    plan = [(c, False) for c in names] + ([(c, True) for c in names] if args.graph else [])
    labels = [c + (" +graph" if g else "") for c, g in plan]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if args.out.exists():
        for line in args.out.open():
            row = json.loads(line)
            done[(row["config"], row["qid"])] = row
    if not args.report_only:
        overrides = {
            "LLM": llm_spec(args),
            "LLM_DEADLINE": 900,
            "AGENT_DEADLINE": 1800,
            "GROUNDER": args.grounder,
        }
        with override_settings(DJANGO_RAG=overrides):
            doc_ids = ensure_corpus(corpus)
            grounder = get_grounder(args.grounder) if args.grounder != "none" else None
            # Question by question (every configuration answers one question before the
            # next), so a run stopped early still pairs its configurations.
            for qid in qids:
                for config, graph in plan:
                    label = config + (" +graph" if graph else "")
                    if (label, qid) in done:
                        continue
                    golds = raw[qid]["metadata"]["answers"]
                    row = measure(
                        config, qid, queries[qid], golds, set(qrels[qid]), graph, grounder, doc_ids
                    )
                    done[(label, qid)] = row
                    with args.out.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                    print(
                        f"{label:14} {qid} F1={row['F1']:.2f} contains={row['contains']:.0f} "
                        f"cite_R={row['cite_R']:.2f} {row['seconds']:.1f}s {row['fallbacks']}",
                        flush=True,
                    )
    rows = [done[(label, q)] for label in labels for q in qids if (label, q) in done]
    print(f"\n{args.model}, first {len(qids)} questions of {args.data.name}\n")
    report(rows, labels)


if __name__ == "__main__":
    main()

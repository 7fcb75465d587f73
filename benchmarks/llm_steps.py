"""How often each LLM step falls back with a given model, with JSON mode off and on; how
well the LLM grounding judge agrees with the gold paragraphs; whether the LLM reranker helps
(docs/benchmarks.md#steps-falling-back-with-the-local-model).

    python benchmarks/local_llm.py serve --port 8765 &          # or a hosted model
    python benchmarks/llm_steps.py --model openai/local --api-base http://127.0.0.1:8765/v1 \\
        [--questions 10] [--part steps|rerank|both] [--out .cache/llm_steps.jsonl]

Uses the ``hotpot`` collection that ``benchmarks/answers.py`` stores (the first
``--questions`` questions of hotpotqa_dev200, hybrid search). Per question:

- ``steps``: each JSON step is called through the library's own component, prompt and parser
  (gate, decompose, the agent's sufficiency verdict, the self-check verdict, one LLM-reranker
  batch of 10, the LLM grounding judge, LLM graph extraction of a gold paragraph), once with
  ``json_mode=False`` and once with ``json_mode=True`` (the same prompt twice in a row, so a
  local server reuses its prompt cache). A step "falls back" when the library would take its
  fallback: a typed ``LLMError``, a reranker batch left unscored, a judge verdict not
  understood. ``rewrite`` (one line, no JSON) runs once.
- the judge's agreement: the sentence "The answer is <gold answer>." (with the question)
  judged against the gold paragraphs (should be supported) and against the two best non-gold
  paragraphs (should not be), JSON mode on.
- ``rerank``: the LLM reranker scores the 30 best hybrid candidates (batches of 10, JSON mode
  on); nDCG@10 of the gold paragraphs for the hybrid order, the reranked order, and the
  reranked order after the default threshold (7) as ``ask(reranker="llm")`` applies it.

Rows are appended to ``--out`` as they are made; a stopped run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.answers import (  # noqa: E402
    COLLECTION,
    dev_questions,
    endpoint_arguments,
    llm_spec,
)
from django_rag.agent import prompts  # noqa: E402
from django_rag.agent.components import Gatekeeper, Rewriter  # noqa: E402
from django_rag.answers.grounding.llm import LLMGrounder  # noqa: E402
from django_rag.evaluation.metrics import bootstrap_interval, ndcg, paired_difference  # noqa: E402
from django_rag.exceptions import LLMError  # noqa: E402
from django_rag.graph.extractors import LLMGraphExtractor  # noqa: E402
from django_rag.llm import get_llm, json_flag, parse_json  # noqa: E402
from django_rag.rerankers.llm import LLMReranker  # noqa: E402
from django_rag.retrieval.rewriters import Decomposer  # noqa: E402

JSON_STEPS = ("gate", "decompose", "reason", "self-check", "rerank", "grounding", "graph")


def _verdict(llm, prompt: str, field: str) -> str:
    json_flag(parse_json(llm.complete(prompt, json_object=True).text), field)
    return ""


def _rerank(llm, question, chunks) -> str:
    scores = LLMReranker(llm=llm, max_concurrency=1).score(question, chunks[:10])
    if scores is None or any(s is None for s in scores):
        return "a batch left unscored"
    return ""


def _ground(llm, sentence, chunks, question):
    grounding = LLMGrounder(llm=llm).ground(sentence, chunks, question=question)
    problem = "; ".join(grounding.warnings) if grounding.warnings else ""
    return problem, grounding.spans[0].verdict if grounding.spans else "none"


def run_step(step, llm, question, chunks, gold_chunks, sentence) -> tuple[str, str]:
    """(problem, detail): an empty problem when the step got what it asked for."""
    if step == "gate":
        return "", str(Gatekeeper(llm=llm)(question)[0])
    if step == "decompose":
        return "", json.dumps(Decomposer(llm=llm)(question))
    if step == "rewrite":
        return "", Rewriter(llm=llm)(question)
    if step == "reason":
        return _verdict(llm, prompts.sufficiency_prompt(question, chunks[:10]), "sufficient"), ""
    if step == "self-check":
        prompt = prompts.groundedness_prompt(question, chunks[:5], sentence + " [1]")
        return _verdict(llm, prompt, "grounded"), ""
    if step == "rerank":
        return _rerank(llm, question, chunks), ""
    if step == "grounding":
        return _ground(llm, sentence, gold_chunks, question)
    if step == "graph":
        extraction = LLMGraphExtractor(llm=llm).extract(gold_chunks[0].text)
        return "", f"{len(extraction.entities)} entities, {len(extraction.relationships)} rels"
    raise ValueError(step)


def rerank_all(llm, question, candidates) -> tuple[str, str]:
    scores = LLMReranker(llm=llm, max_concurrency=1).score(question, candidates)
    pairs = [[r.source_id, s] for r, s in zip(candidates, scores or [], strict=False)]
    return ("" if scores else "no scores"), json.dumps(pairs)


def measure(out, done, key, func, *args):
    if key in done:
        return done[key]
    start = time.perf_counter()
    try:
        problem, detail = func(*args)
    except LLMError as exc:
        problem, detail = f"{type(exc).__name__}: {str(exc)[:300]}", ""
    row = {
        "key": list(key),
        "problem": problem,
        "detail": detail if key[1] == "rerank-30" else detail[:300],
        "seconds": time.perf_counter() - start,
    }
    done[key] = row
    with out.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(f"{' '.join(map(str, key)):60} {problem[:60] or 'ok'} {row['seconds']:.1f}s", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    endpoint_arguments(parser)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--part", choices=("steps", "rerank", "both"), default="both")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "llm_steps.jsonl")
    args = parser.parse_args()

    _, queries, qrels, raw, qids = dev_questions(args.data, args.questions)
    base = llm_spec(args)
    llms = {mode: get_llm({**base, "json_mode": mode == "on"}) for mode in ("off", "on")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if args.out.exists():
        for line in args.out.open():
            row = json.loads(line)
            done[tuple(row["key"])] = row
    # A local model on a loaded CPU is slow: no answer deadline cuts a step short.
    settings = override_settings(DJANGO_RAG={"LLM_DEADLINE": 900, "AGENT_DEADLINE": 1800})
    settings.enable()
    for qid in [] if args.report_only else qids:
        question, gold = queries[qid], raw[qid]["metadata"]["answers"][0]
        candidates = rag.search(question, collection=COLLECTION, mode="hybrid", limit=30)
        gold_chunks = [
            r
            for r in rag.search(question, collection=COLLECTION, mode="hybrid", limit=100)
            if r.source_id in qrels[qid]
        ]
        gold_chunks = list({r.source_id: r for r in gold_chunks}.values())
        others = [r for r in candidates if r.source_id not in qrels[qid]][:2]
        # One sentence (a question inside it would split it in two); the judge is given
        # the question separately.
        sentence = f"The answer is {gold}."
        if args.part in ("steps", "both") and gold_chunks:
            context = (question, candidates[:10], gold_chunks, sentence)
            measure(
                args.out, done, (qid, "rewrite", "off"), run_step, "rewrite", llms["off"], *context
            )
            for step in JSON_STEPS:
                for mode in ("off", "on"):
                    measure(args.out, done, (qid, step, mode), run_step, step, llms[mode], *context)
            measure(
                args.out,
                done,
                (qid, "judge-nongold", "on"),
                _ground,
                llms["on"],
                sentence,
                others,
                question,
            )
        if args.part in ("rerank", "both"):
            measure(
                args.out,
                done,
                (qid, "rerank-30", "on"),
                rerank_all,
                llms["on"],
                question,
                candidates,
            )
    report(done, qids, qrels)


def _docs(ids):
    return list(dict.fromkeys(ids))


def report(done, qids, qrels) -> None:
    print(
        "\n| step | n | fell back, JSON mode off | fell back, JSON mode on | s/call off | s/call on |"
    )
    print("|---|---|---|---|---|---|")
    for step in ("rewrite", *JSON_STEPS):
        cells = []
        for mode in ("off", "on"):
            rows = [done[(q, step, mode)] for q in qids if (q, step, mode) in done]
            cells.append(rows)
        n = max(len(c) for c in cells)
        if not n:
            continue
        fell = [f"{sum(bool(r['problem']) for r in c)}/{len(c)}" if c else "-" for c in cells]
        secs = [f"{sum(r['seconds'] for r in c) / len(c):.1f}" if c else "-" for c in cells]
        print(f"| {step} | {n} | {fell[0]} | {fell[1]} | {secs[0]} | {secs[1]} |")
    agree = []
    for q in qids:
        gold_row, other_row = done.get((q, "grounding", "on")), done.get((q, "judge-nongold", "on"))
        if gold_row and other_row:
            agree.append((gold_row["detail"] == "supported", other_row["detail"] != "supported"))
    if agree:
        print(
            f"\njudge: gold answer supported by the gold paragraphs {sum(a for a, _ in agree)}/"
            f"{len(agree)}; not supported by two non-gold paragraphs {sum(b for _, b in agree)}/"
            f"{len(agree)}"
        )
    hybrid, reranked, kept = [], [], []
    for q in qids:
        row = done.get((q, "rerank-30", "on"))
        if not row or row["problem"]:
            continue
        pairs = json.loads(row["detail"]) if row["detail"].startswith("[") else []
        if not pairs:
            continue
        relevant = {d: 1 for d in qrels[q]}
        order = [d for d, _ in pairs]
        by_score = [d for d, s in sorted(pairs, key=lambda p: -(p[1] or 0))]
        above = [d for d, s in sorted(pairs, key=lambda p: -(p[1] or 0)) if (s or 0) >= 7]
        hybrid.append(ndcg(_docs(order), relevant))
        reranked.append(ndcg(_docs(by_score), relevant))
        kept.append(ndcg(_docs(above), relevant))
    if hybrid:
        print(f"\nLLM reranker over 30 hybrid candidates, {len(hybrid)} questions, nDCG@10:")
        for label, values in (("hybrid", hybrid), ("reranked", reranked), ("reranked, >= 7", kept)):
            mean, low, high = bootstrap_interval(values)
            print(f"  {label:15} {mean:.3f} [{low:.3f}, {high:.3f}]")
        for label, values in (("reranked", reranked), ("reranked, >= 7", kept)):
            mean, low, high = paired_difference(hybrid, values)
            print(f"  {label} - hybrid: {mean:+.3f} [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main()

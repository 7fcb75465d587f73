"""Evaluation runs: search every test case, score it, store the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from statistics import fmean
from typing import Any

from django.db.models import Prefetch, Q
from django.utils import timezone

from ..agent.answer import answer_messages
from ..conf import search_setting
from ..embeddings import active_dimensions, get_embedder
from ..exceptions import InvalidInput, LLMError, UnknownCollection
from ..llm import collect_usage, get_llm, parse_json
from ..models import Collection, Relevance, Run, TestCase
from ..retrieval.service import MAX_LIMIT, normalize_collections, normalize_mode, search
from ..signals import span
from ..validation import clean_positive_int, clean_source_id
from . import prompts
from .metrics import METRIC_NAMES, aggregate, case_metrics, paired_difference

logger = logging.getLogger(__name__)

# Document-level cases (BEIR) rank documents: fetch enough chunks to fill the top 10 documents.
DOCUMENT_FETCH = 100


class NoTestCases(InvalidInput):
    code = "no_test_cases"


class UnknownEvaluationCollection(UnknownCollection, NoTestCases):
    """An evaluation was asked for a collection that does not exist. Also a
    :class:`NoTestCases` (what this raised before), so existing handlers keep working."""


def check_collections(names: Sequence[str] | None) -> None:
    """Raise :class:`~django_rag.exceptions.UnknownCollection` for a name with no collection
    (a typo must not look like "no test cases" or "no chunks")."""
    if not names:
        return
    found = set(Collection.objects.filter(name__in=names).values_list("name", flat=True))
    for name in names:
        if name not in found:
            raise UnknownEvaluationCollection(name)


def _config(mode: str, limit: int, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    embedder = get_embedder(options.get("embedder"))
    reranker = options.get("reranker")
    config = {
        "mode": mode,
        "limit": limit,
        "embedder": embedder.model_name,
        "dimensions": active_dimensions(),
        "fusion": options.get("fusion") or search_setting("FUSION"),
        "semantic_weight": options.get("semantic_weight", search_setting("SEMANTIC_WEIGHT")),
        "fulltext_weight": options.get("fulltext_weight", search_setting("FULLTEXT_WEIGHT")),
        "reranker": None if reranker is None else getattr(reranker, "name", repr(reranker)),
        **extra,
    }
    return config


def _judge(llm, prompt: str) -> tuple[float | None, str]:
    try:
        data = parse_json(llm.complete(prompt).text)
        score = float(data["score"])
    except (LLMError, KeyError, TypeError, ValueError) as exc:
        return None, f"not scored: {exc}"
    return max(0.0, min(10.0, score)), str(data.get("reasoning") or "")


def _answer_metrics(llm, case: TestCase, results) -> dict[str, Any]:
    chunks = list(results[:5])
    try:
        system, user = answer_messages(case.question, chunks)
        answer = llm.complete(user, system=system).text.strip()
    except LLMError as exc:
        return {"answer": None, "answer_error": str(exc)}
    out: dict[str, Any] = {"answer": answer}
    out["faithfulness"], out["faithfulness_reasoning"] = _judge(
        llm, prompts.faithfulness_prompt(case.question, chunks, answer)
    )
    if case.reference_answer:
        out["correctness"], out["correctness_reasoning"] = _judge(
            llm, prompts.correctness_prompt(case.question, answer, case.reference_answer)
        )
    return out


def run_evaluation(
    *,
    mode: str | None = None,
    collection: str | Sequence[str] | None = None,
    source_id: str | None = None,
    evaluate_answers: bool = False,
    llm: Any = None,
    limit: int = 10,
    progress: Callable[[int, int], None] | None = None,
    **search_options: Any,
) -> Run:
    """Search every test case (of ``collection``, or all), score the results, store a Run.

    Each case is searched in ``collection`` when given, else in its own collection. Chunk-level
    cases rank chunks; document-level cases (BEIR) rank documents by their best chunk. With
    ``evaluate_answers`` the LLM answers from the top 5 chunks and judges faithfulness (0-10)
    and, where the case has a reference answer, correctness (0-10). A run that fails is stored
    with status ``failed`` and its error, and the error is raised.
    """
    mode = normalize_mode(mode)
    names = normalize_collections(collection)
    clean_positive_int("limit", limit, maximum=MAX_LIMIT)
    source_id = clean_source_id(source_id) or None
    check_collections(names)
    model = get_llm(llm, feature="Answer evaluation") if evaluate_answers else None
    cases = TestCase.objects.select_related("collection").prefetch_related(
        Prefetch("relevance", queryset=Relevance.objects.all())
    )
    if names is not None:
        cases = cases.filter(collection__name__in=names)
    if source_id:
        cases = cases.filter(
            Q(relevance__chunk__document__source_id=source_id)
            | Q(relevance__document__source_id=source_id)
        ).distinct()
    cases = list(cases.order_by("id"))
    if not cases:
        raise NoTestCases(
            "No test cases to run. Create some with generate_test_cases(), create_test_case() "
            "or import_beir() (manage.py rag_eval generate | import-beir)."
        )
    run = Run.objects.create(
        mode=mode,
        test_case_count=len(cases),
        config=_config(
            mode,
            limit,
            search_options,
            collections=names,
            source_id=source_id,
            evaluate_answers=evaluate_answers,
            llm=model.model_name if model else None,
        ),
    )
    try:
        with span("evaluation.run", run_id=run.pk, mode=mode, total=len(cases)) as s:
            with collect_usage() as usage:
                results = _run_cases(
                    run, cases, mode, names, source_id, model, limit, progress, search_options
                )
            scored = [r for r in results if not r.get("skipped")]
            run.metrics = aggregate(scored)
            run.metrics["skipped"] = len(results) - len(scored)
            for name in ("faithfulness", "correctness"):
                values = [r[name] for r in scored if r.get(name) is not None]
                if values:
                    run.metrics[name] = fmean(values)
            run.results = results
            run.usage = usage.to_dict()
            run.status = Run.Status.COMPLETED
            run.finished_at = timezone.now()
            run.save()
            s.set(**{name: run.metrics[name] for name in ("mrr", "ndcg_at_10", "recall_at_5")})
    except BaseException as exc:
        run.status = Run.Status.FAILED
        run.error = f"{type(exc).__name__}: {exc}"
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
        exc.add_note(f"evaluation run {run.pk} was stored as failed")
        raise
    return run


def _run_cases(run, cases, mode, names, source_id, model, limit, progress, search_options):
    results = []
    for done, case in enumerate(cases, start=1):
        level = case.level
        relevant = {
            (r.chunk_id if level == TestCase.Level.CHUNK else r.document_id): r.grade
            for r in case.relevance.all()
        }
        record: dict[str, Any] = {"test_case_id": case.pk, "question": case.question}
        if not relevant:
            # Its relevant chunks were deleted (re-ingested documents): nothing to score.
            results.append({**record, "skipped": "no relevant chunks or documents left"})
            continue
        scope = (
            names if names is not None else ([case.collection.name] if case.collection else None)
        )
        hits = search(
            case.question,
            mode=mode,
            collection=scope,
            source_id=source_id,
            limit=limit if level == TestCase.Level.CHUNK else max(DOCUMENT_FETCH, limit),
            **search_options,
        )
        if level == TestCase.Level.CHUNK:
            retrieved = [hit.chunk_id for hit in hits]
        else:
            retrieved = list(dict.fromkeys(hit.document_id for hit in hits))
        record.update(case_metrics(retrieved[:limit], relevant))
        record["expected"] = sorted(relevant)
        record["retrieved"] = retrieved[:limit]
        if model is not None:
            record.update(_answer_metrics(model, case, hits))
        results.append(record)
        if progress:
            progress(done, len(cases))
    return results


def compare_runs(first: Run | int, second: Run | int) -> dict[str, dict[str, float | None]]:
    """Each metric of two runs and the change from the first to the second."""
    a = first if isinstance(first, Run) else Run.objects.get(pk=first)
    b = second if isinstance(second, Run) else Run.objects.get(pk=second)
    names = [*METRIC_NAMES, "faithfulness", "correctness"]
    table = {}
    for name in names:
        x, y = a.metrics.get(name), b.metrics.get(name)
        if x is None and y is None:
            continue
        table[name] = {"first": x, "second": y, "delta": None if x is None or y is None else y - x}
    paired = paired_ndcg(a, b)
    if paired is not None:
        table["paired_ndcg_at_10"] = paired
    return table


def paired_ndcg(first: Run, second: Run) -> dict[str, float] | None:
    """nDCG@10 of the second run minus the first's, over the test cases both scored, with a
    95% bootstrap interval (None when they share no scored case)."""

    def scores(run: Run) -> dict[Any, float]:
        return {
            r["test_case_id"]: r["ndcg_at_10"]
            for r in run.results
            if not r.get("skipped") and "ndcg_at_10" in r
        }

    x, y = scores(first), scores(second)
    common = sorted(set(x) & set(y))
    if not common:
        return None
    mean, low, high = paired_difference([x[c] for c in common], [y[c] for c in common])
    return {"cases": len(common), "delta": mean, "low": low, "high": high}

"""Evaluation runs: search every test case, score it, store the run."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from statistics import fmean
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from ..agent import Agent, Context, Loop, LoopResult
from ..agent.steps import STEPS
from ..answers.grounding import get_grounder, ground_text
from ..answers.service import answer_messages
from ..conf import get_setting, get_settings, redact, scrub_text, search_setting
from ..embeddings import active_dimensions, get_embedder
from ..exceptions import InvalidInput, InvalidOption, LLMError, RunNotFound, UnknownCollection
from ..llm import collect_usage, get_llm
from ..models import Collection, Relevance, Run, TestCase
from ..results import Answer, SearchResult
from ..retrieval.request import MAX_LIMIT, normalize_mode
from ..retrieval.service import search
from ..signals import span
from ..validation import (
    clean_collection_names,
    clean_int,
    clean_pk,
    clean_positive_int,
    clean_source_id,
    clean_string,
)
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
        "vector_store": _component_label(
            options.get("vector_store") or get_setting("VECTOR_STORE")
        ),
        "graph": _graph_config(options.get("graph")),
        **extra,
    }
    return config


def _component_label(component: Any) -> str:
    """A setting's component as text: its alias or dotted path, else its class's path."""
    if isinstance(component, str):
        return component
    kind = component if isinstance(component, type) else type(component)
    return f"{kind.__module__}.{kind.__qualname__}"


def _graph_config(per_call: Any) -> dict[str, Any]:
    """The graph settings a run searched with (secrets redacted, components as text), so
    two runs can be told apart by what they used: ``enabled`` is the run's ``graph=``
    search option when given, else ``GRAPH["ENABLED"]``."""
    graph = dict(get_settings()["GRAPH"] or {})
    enabled = graph.get("ENABLED", False) if per_call is None else per_call
    shown = {"enabled": bool(enabled)}
    for key, value in sorted(graph.items()):
        if key == "ENABLED":
            continue
        value = redact(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = _component_label(value)
        shown[key.lower()] = value
    return shown


def _judge(llm, prompt: str) -> tuple[float | None, str]:
    try:
        data = llm.complete_json(prompt)
        score = float(data["score"])
    except (LLMError, KeyError, TypeError, ValueError, OverflowError) as exc:
        return None, f"not scored: {scrub_text(exc)[:200]}"
    return max(0.0, min(10.0, score)), str(data.get("reasoning") or "")


JUDGE_PROMPTS = ("faithfulness", "correctness")


def _check_judge_prompts(judge_prompts: Mapping[str, Any] | None) -> dict[str, Any]:
    if judge_prompts is None:
        return {}
    if not isinstance(judge_prompts, Mapping):
        raise InvalidOption(
            "judge_prompts must be a dict like {'faithfulness': f(question, chunks, answer), "
            "'correctness': f(question, answer, reference)}"
        )
    unknown = sorted(set(judge_prompts) - set(JUDGE_PROMPTS))
    if unknown:
        raise InvalidOption(
            f"unknown judge prompt {unknown[0]!r}; the judge prompts are "
            + ", ".join(JUDGE_PROMPTS)
        )
    for name, func in judge_prompts.items():
        if not callable(func):
            raise InvalidOption(f"judge_prompts[{name!r}] must be a function returning a prompt")
    return dict(judge_prompts)


def _answer_metrics(
    llm, case: TestCase, results, answer: str | None, grounder, judge_prompts
) -> dict[str, Any]:
    chunks = list(results[:5])
    out: dict[str, Any] = {}
    if answer is None:
        try:
            system, user = answer_messages(case.question, chunks)
            answer = llm.complete(user, system=system, context=chunks).text.strip()
        except LLMError as exc:
            return {"answer": None, "answer_error": str(exc)}
    else:
        # The retriever's own answer is judged (against every chunk it returned).
        chunks = list(results)
        out["answer_source"] = "retriever"
    out["answer"] = answer
    if grounder is not None:
        failures: list[str] = []
        grounding = ground_text(answer, chunks, grounder, question=case.question, warnings=failures)
        if grounding is None:
            out["grounding"] = None
            out["faithfulness"] = None
            out["faithfulness_reasoning"] = "not scored: " + "; ".join(failures)
        else:
            out["grounding"] = grounding.to_dict()
            out["faithfulness"] = 10.0 * grounding.score
            supported = sum(1 for span in grounding.spans if span.verdict == "supported")
            out["faithfulness_reasoning"] = (
                f"{grounding.grounder}: {supported} of {len(grounding.spans)} spans supported"
                + "".join(f"; {warning}" for warning in grounding.warnings)
            )
    else:
        prompt = judge_prompts.get("faithfulness", prompts.faithfulness_prompt)
        out["faithfulness"], out["faithfulness_reasoning"] = _judge(
            llm, prompt(case.question, chunks, answer)
        )
    if case.reference_answer:
        prompt = judge_prompts.get("correctness", prompts.correctness_prompt)
        out["correctness"], out["correctness_reasoning"] = _judge(
            llm, prompt(case.question, answer, case.reference_answer)
        )
    return out


# --- retrievers ---------------------------------------------------------------------------------


def _step_spec(item: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str):
        name, options = item, {}
    elif (
        isinstance(item, list | tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], Mapping)
    ):
        name, options = item[0], dict(item[1])
    else:
        raise InvalidOption(f"an agent step is a name or a (name, options) pair, got {item!r:.80}")
    if name not in STEPS:
        raise InvalidOption(
            f"unknown agent step {name!r}; the steps are {', '.join(s.name for s in STEPS.in_order())}"
        )
    return name, options


def resolve_retriever(retriever: Any) -> tuple[str, Any]:
    """``(kind, spec)`` for a ``retriever=`` option; bad values raise
    :class:`~django_rag.exceptions.InvalidOption`.

    ``"search"`` (or None), ``"loop"``, an agent configuration (a list of step names or
    ``(name, options)`` pairs, e.g. ``["rewrite", "search", ("rerank", {"top_k": 5}),
    "answer"]``) or a callable ``retriever(question, collection=..., limit=...)``.
    """
    if retriever is None or retriever == "search":
        return "search", None
    if retriever == "loop":
        return "loop", None
    if isinstance(retriever, list | tuple):
        steps = [_step_spec(item) for item in retriever]
        if not any(name == "search" for name, _ in steps):
            raise InvalidOption("an agent configuration needs a 'search' step")
        return "agent", steps
    if callable(retriever):
        return "custom", retriever
    raise InvalidOption(
        "retriever must be 'search', 'loop', a list of agent steps or a function, got "
        f"{retriever!r:.80}"
    )


def _retriever_name(kind: str, spec: Any) -> Any:
    if kind == "agent":
        return [name if not options else [name, options] for name, options in spec]
    if kind == "custom":
        return getattr(spec, "__qualname__", type(spec).__name__)
    return kind


def _error_text(error: Exception | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {scrub_text(error)[:500]}"


def _unpack(value: Any) -> tuple[list[SearchResult], str | None, str | None]:
    """(results, answer, error) from what a retriever returned."""
    if isinstance(value, LoopResult):
        return list(value.chunks), value.text or None, _error_text(value.error)
    if isinstance(value, Answer):
        return list(value.chunks), value.text or None, None
    if isinstance(value, Agent):
        value = value.context
    if isinstance(value, Context):
        return list(value.chunks or value.context_used), value.answer, _error_text(value.error)
    if isinstance(value, Mapping):
        results, answer = value.get("results"), value.get("answer")
    elif isinstance(value, tuple) and len(value) == 2:
        results, answer = value
    else:
        results, answer = value, None
    if not isinstance(results, list | tuple) or not all(
        isinstance(item, SearchResult) for item in results
    ):
        raise InvalidOption(
            "a retriever function must return a list of SearchResult, a (results, answer) "
            "pair, a dict with 'results' (and 'answer'), an Answer or an Agent; got "
            f"{type(value).__name__}"
        )
    if answer is not None and not isinstance(answer, str):
        answer = str(answer)
    return list(results), answer, None


def _retrieve(kind, spec, case, scope, source_id, fetch, model, mode, search_options):
    """(results, answer, error) of one case; exceptions propagate."""
    if kind == "search":
        hits = search(
            case.question,
            mode=mode,
            collection=scope,
            source_id=source_id,
            limit=fetch,
            **search_options,
        )
        return hits, None, None
    if kind == "loop":
        return _unpack(
            Loop(
                case.question,
                collection=scope,
                llm=model,
                limit=min(fetch, 20),
                max_limit=max(fetch, 20),
                max_chunks=max(fetch, 20),
                mode=mode,
                source_id=source_id,
                **search_options,
            ).run()
        )
    if kind == "agent":
        agent = Agent(
            case.question,
            llm=model,
            limit=fetch,
            mode=mode,
            source_id=source_id,
            **search_options,
        )
        for name, options in spec:
            if name == "search" and scope is not None and "collection" not in options:
                options = {"collection": scope if len(scope) > 1 else scope[0], **options}
            getattr(agent, name)(**options)
        return _unpack(agent)
    return _unpack(spec(case.question, collection=scope, limit=fetch))


def run_evaluation(
    *,
    mode: str | None = None,
    collection: str | Sequence[str] | None = None,
    source_id: str | None = None,
    evaluate_answers: bool = False,
    llm: Any = None,
    limit: int = 10,
    progress: Callable[[int, int], None] | None = None,
    retriever: Any = "search",
    grounder: Any = None,
    judge_prompts: Mapping[str, Any] | None = None,
    fail_fast: bool = False,
    run_ref: str | None = None,
    **search_options: Any,
) -> Run:
    """Search every test case (of ``collection``, or all), score the results, store a Run.

    Each case is searched in ``collection`` when given, else in its own collection. Chunk-level
    cases rank chunks; document-level cases (BEIR) rank documents by their best chunk. With
    ``evaluate_answers`` the LLM answers from the top 5 chunks and judges faithfulness (0-10)
    and, where the case has a reference answer, correctness (0-10). A run that fails is stored
    with status ``failed`` and its error, and the error is raised.

    ``retriever`` is what each case is run through: ``"search"`` (the default), ``"loop"``
    (a :class:`~django_rag.Loop` with ``llm``), an agent configuration (a list of step names
    or ``(name, options)`` pairs run as an :class:`~django_rag.Agent` with ``llm``) or a
    function ``retriever(question, collection=..., limit=...)`` returning results, a
    ``(results, answer)`` pair, an :class:`~django_rag.Answer` or an ``Agent``. When the
    retriever gives an answer, ``evaluate_answers`` judges that answer instead of writing
    one. A retriever error counts as an empty result for its case (recorded as ``error``)
    unless ``fail_fast``. ``grounder`` (True, an alias or a grounder) scores faithfulness as
    10 x the grounding score instead of the 0-10 judge; ``judge_prompts``
    replaces the ``faithfulness`` / ``correctness`` judge prompts.

    Telemetry: the run is one ``evaluation.run`` span (its start, sent before the first case,
    carries ``run_id``, ``run_ref`` and ``total``) and each case one ``evaluation.case`` span
    inside it, carrying ``run_id``, ``run_ref``, ``index`` (from 1) and ``total``.
    ``run_ref`` is any text of yours (at most 200 characters) that ties those events to
    something of yours, a job or a request; it is stored in the run's ``config``.
    """
    mode = normalize_mode(mode).value
    names = clean_collection_names(collection)
    clean_positive_int("limit", limit, maximum=MAX_LIMIT)
    source_id = clean_source_id(source_id) or None
    if run_ref is not None:
        run_ref = clean_string(run_ref, "run_ref", max_length=200)
    check_collections(names)
    kind, spec = resolve_retriever(retriever)
    judge_prompts = _check_judge_prompts(judge_prompts)
    needs_llm = evaluate_answers or kind in ("loop", "agent")
    model = get_llm(llm, feature="Answer evaluation") if needs_llm else None
    grounding = None
    if grounder is not None and grounder is not False:
        grounding = get_grounder(grounder, llm=model)
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
            retriever=_retriever_name(kind, spec),
            grounder=None if grounding is None else grounding.name,
            custom_judge_prompts=sorted(judge_prompts),
            fail_fast=fail_fast,
            run_ref=run_ref,
        ),
    )
    try:
        with span(
            "evaluation.run", run_id=run.pk, run_ref=run_ref, mode=mode, total=len(cases)
        ) as s:
            with collect_usage() as usage:
                results = _run_cases(
                    run,
                    cases,
                    mode,
                    names,
                    source_id,
                    model,
                    limit,
                    progress,
                    search_options,
                    retriever=(kind, spec),
                    evaluate_answers=evaluate_answers,
                    grounder=grounding,
                    judge_prompts=judge_prompts,
                    fail_fast=fail_fast,
                    run_ref=run_ref,
                )
            scored = [r for r in results if not r.get("skipped")]
            run.metrics = aggregate(scored)
            run.metrics["skipped"] = len(results) - len(scored)
            run.metrics["errors"] = sum(1 for r in results if r.get("error"))
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


def _run_cases(
    run,
    cases,
    mode,
    names,
    source_id,
    model,
    limit,
    progress,
    search_options,
    *,
    retriever=("search", None),
    evaluate_answers=False,
    grounder=None,
    judge_prompts=None,
    fail_fast=False,
    run_ref=None,
):
    kind, spec = retriever
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
        fetch = limit if level == TestCase.Level.CHUNK else max(DOCUMENT_FETCH, limit)
        with span(
            "evaluation.case",
            run_id=run.pk,
            run_ref=run_ref,
            index=done,
            total=len(cases),
            test_case_id=case.pk,
            retriever=kind,
            question=case.question,
        ) as s:
            try:
                hits, answer, error = _retrieve(
                    kind, spec, case, scope, source_id, fetch, model, mode, search_options
                )
            except Exception as exc:
                if fail_fast:
                    raise
                hits, answer, error = [], None, _error_text(exc)
                logger.warning("evaluation case %s: the retriever failed: %s", case.pk, error)
            if level == TestCase.Level.CHUNK:
                retrieved = [hit.chunk_id for hit in hits]
            else:
                retrieved = list(dict.fromkeys(hit.document_id for hit in hits))
            record.update(case_metrics(retrieved[:limit], relevant))
            record["expected"] = sorted(relevant)
            record["retrieved"] = retrieved[:limit]
            if error:
                record["error"] = error
            if answer is not None and not evaluate_answers:
                record["answer"] = answer
            if evaluate_answers and (hits or answer is not None or not error):
                record.update(
                    _answer_metrics(model, case, hits, answer, grounder, judge_prompts or {})
                )
            s.set(
                ndcg_at_10=record["ndcg_at_10"],
                retrieved=len(retrieved),
                error=error,
                faithfulness=record.get("faithfulness"),
            )
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


# --- reading and deleting runs ---------------------------------------------------------------


def _runs(collection: Any) -> QuerySet[Run]:
    runs = Run.objects.all()
    names = clean_collection_names(collection)
    if names is not None:
        # Scoped, a run is seen only when it was scoped itself, to allowed collections alone:
        # an unscoped run searched every collection, so its results may show any of them.
        runs = runs.filter(config__collections__contained_by=names).exclude(config__collections=[])
    return runs


def list_runs(
    *, collection: str | Sequence[str] | None = None, limit: int = 20, offset: int = 0
) -> list[Run]:
    """Evaluation runs, newest first. With ``collection`` (a name or a list), only the runs
    scoped to some of those collections (``run_evaluation(collection=...)``); unscoped runs
    are left out. ``limit`` (0 to 1000) and ``offset`` page through them."""
    limit = clean_int("limit", limit, minimum=0, maximum=1000)
    offset = clean_int("offset", offset, minimum=0)
    page = _runs(collection).order_by("-started_at", "-id")[offset : offset + limit]
    return list(page) if limit else []


def get_run(run_id: Any, *, collection: str | Sequence[str] | None = None) -> Run:
    """The run with this id; :class:`~django_rag.exceptions.RunNotFound` when there is none,
    when it lies outside ``collection`` (as :func:`list_runs` scopes) or for an id that
    cannot be one."""
    pk = clean_pk(run_id, RunNotFound, "evaluation run")
    run = _runs(collection).filter(pk=pk).first()
    if run is None:
        raise RunNotFound(f"No evaluation run with id {pk} here.", id=pk)
    return run


def delete_run(run_id: Any, *, collection: str | Sequence[str] | None = None) -> None:
    """Delete a run. The scope is part of the DELETE: a run outside ``collection`` raises
    :class:`~django_rag.exceptions.RunNotFound`, as an unknown id does, and stays."""
    pk = clean_pk(run_id, RunNotFound, "evaluation run")
    deleted, _ = _runs(collection).filter(pk=pk).delete()
    if not deleted:
        raise RunNotFound(f"No evaluation run with id {pk} here.", id=pk)

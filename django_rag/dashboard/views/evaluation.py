"""The Evaluation pages: test cases, runs started as jobs, the metrics chart and one run."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from ...agent.steps import STEPS
from ...evaluation.runs import resolve_retriever
from ...exceptions import InvalidOption
from ...models import Job, Run, TestCase
from ...modes import MODES
from ...retrieval.request import normalize_mode
from ..access import check_collection, dashboard_view, object_id, param, scope
from .common import confirm_page, grounded_segments, jobs_of_kinds, page_context, polling, start_job

EVALUATION_JOBS = [Job.Kind.RUN_EVALUATION, Job.Kind.GENERATE_TEST_CASES]


@dashboard_view
def evaluation(request):

    cases = scope(TestCase.objects.select_related("collection"), request)
    runs = list(_visible_runs(request)[:200])
    if request.method == "POST":
        action = request.POST.get("action")
        collection = param(request, "collection", method="POST", max_length=255) or None
        if action == "delete_case":
            case = get_object_or_404(cases, pk=object_id(request.POST.get("case")))
            if page := confirm_page(
                request,
                title="Delete this test case?",
                message=case.question,
                details=["Past runs keep their results; future runs no longer include it."],
                button="Delete test case",
            ):
                return page
            case.delete()
            messages.success(request, "Test case deleted.")
            return redirect("django_rag_dashboard:evaluation")
        if action == "delete_run":
            return _delete_run(request)
        if collection:
            check_collection(request, collection)
        elif request.rag_collections is not None:
            messages.error(request, "Choose one of your collections.")
            return redirect("django_rag_dashboard:evaluation")
        if action == "run":
            try:
                options = _evaluation_options(request)
            except InvalidOption as exc:
                messages.error(request, str(exc))
                return redirect("django_rag_dashboard:evaluation")
            start_job(
                request,
                "run_evaluation",
                mode=normalize_mode(request.POST.get("mode") or "hybrid"),
                collection=collection,
                **options,
            )
        elif action == "generate":
            try:
                size = max(1, min(500, int(request.POST.get("sample_size") or 20)))
            except ValueError:
                size = 20
            start_job(request, "generate_test_cases", sample_size=size, collection=collection)
        return redirect("django_rag_dashboard:evaluation")
    jobs = jobs_of_kinds(request, EVALUATION_JOBS)
    view = request.GET.get("view") if request.GET.get("view") in ("runs", "cases") else ""
    return render(
        request,
        "django_rag/dashboard/evaluation.html",
        page_context(
            request,
            view=view,
            cases=cases.order_by("-created_at")[:50],
            case_count=cases.count(),
            runs=runs[:20],
            chart=_chart(list(reversed(runs[:30]))),
            jobs=jobs,
            polling=polling(jobs),
            jobs_url=reverse("django_rag_dashboard:evaluation_jobs"),
            modes=list(MODES),
            retrievers=EVALUATION_RETRIEVERS,
            grounders=EVALUATION_GROUNDERS,
            default_steps="rewrite,search,answer",
            step_names=[spec.name for spec in STEPS.in_order() if spec.pipeline],
        ),
    )


def _delete_run(request):
    """Delete one run (scoped, confirmed first); a run still running is refused: its job would
    write it back when it ends."""
    run_ = get_object_or_404(_visible_runs(request), pk=object_id(request.POST.get("run")))
    if run_.status == Run.Status.RUNNING:
        messages.error(request, f"Run {run_.pk} is still running: delete it once it has ended.")
        return redirect("django_rag_dashboard:evaluation_run", pk=run_.pk)
    if page := confirm_page(
        request,
        title=f"Delete run {run_.pk}?",
        message="The run, its metrics and every case's result are deleted; the test cases stay. "
        "This cannot be undone.",
        details=[
            f"{run_.mode} search, {run_.test_case_count} cases, "
            f"started {run_.started_at:%Y-%m-%d %H:%M}"
        ],
        button="Delete run",
    ):
        return page
    pk = run_.pk
    run_.delete()
    messages.success(request, f"Run {pk} deleted.")
    return HttpResponseRedirect(reverse("django_rag_dashboard:evaluation") + "?view=runs")


#: A case's correctness (the judge's 0 to 10) counted as correct from this grade up.
CORRECT_FROM = 7


def _correctness(run_, cases) -> dict | None:
    """The run-level correctness card: the mean correctness and faithfulness (0 to 10) the run
    stored, how many cases were judged and how many graded correct; None when not judged."""
    graded = [c["correctness"] for c in cases if isinstance(c.get("correctness"), int | float)]
    faithful = [c["faithfulness"] for c in cases if isinstance(c.get("faithfulness"), int | float)]
    if not graded and not faithful:
        return None
    return {
        "correctness": run_.metrics.get("correctness"),
        "faithfulness": run_.metrics.get("faithfulness"),
        "graded": len(graded),
        "correct": sum(1 for value in graded if value >= CORRECT_FROM),
        "faithful_cases": len(faithful),
        "from": CORRECT_FROM,
    }


EVALUATION_RETRIEVERS = [
    ("search", "Search"),
    ("agent", "Agent pipeline"),
    ("loop", "Loop (tool calling)"),
]
EVALUATION_GROUNDERS = [
    ("", "LLM judge (0-10)"),
    ("llm", "LLM grounder"),
    ("cross-encoder", "Cross-encoder grounder"),
]


def _evaluation_options(request) -> dict:
    """The run form's retriever, answer judging and grounder, checked (JSON-ready job params)."""
    retriever = request.POST.get("retriever") or "search"
    if retriever not in dict(EVALUATION_RETRIEVERS):
        raise InvalidOption(f"Unknown retriever {retriever[:40]!r}.")
    options: dict = {}
    if retriever == "agent":
        text = param(request, "steps", method="POST", max_length=300) or ""
        steps = [step.strip() for step in text.split(",") if step.strip()]
        resolve_retriever(steps)  # an unknown step or no search step is refused here
        options["retriever"] = steps
    elif retriever != "search":
        options["retriever"] = retriever
    if request.POST.get("evaluate_answers"):
        options["evaluate_answers"] = True
        grounder = request.POST.get("grounder") or ""
        if grounder not in dict(EVALUATION_GROUNDERS):
            raise InvalidOption(f"Unknown grounder {grounder[:40]!r}.")
        if grounder:
            options["grounder"] = grounder
    return options


@dashboard_view
def evaluation_jobs(request):
    jobs = jobs_of_kinds(request, EVALUATION_JOBS)
    return render(
        request,
        "django_rag/dashboard/_jobs.html",
        {
            "jobs": jobs,
            "polling": polling(jobs),
            "jobs_url": reverse("django_rag_dashboard:evaluation_jobs"),
        },
    )


CHART_METRICS = [
    ("recall_at_5", "Recall@5", "#2457c5", "4 0"),
    ("mrr", "MRR", "#1c7c3c", "6 3"),
    ("ndcg_at_10", "nDCG@10", "#a05a00", "2 2"),
]
# The chart's plot area inside its 640 x 300 viewBox: room on the left and below for the axes.
PLOT = {"left": 56, "right": 620, "top": 16, "bottom": 250}


def _chart(runs) -> dict:
    """A line chart of a few metrics over the completed runs, oldest first: y from 0 to 1 with
    ticks, x the run numbers, every point labelled with its value (in its tooltip)."""
    done = [r for r in runs if r.status == "completed"]
    if len(done) < 2:
        return {"lines": [], "runs": len(done)}
    width = PLOT["right"] - PLOT["left"]
    height = PLOT["bottom"] - PLOT["top"]
    step = width / (len(done) - 1)

    def y(value: float) -> float:
        return round(PLOT["bottom"] - height * max(0.0, min(1.0, value)), 1)

    lines = []
    for name, label, color, dash in CHART_METRICS:
        points = [
            {
                "x": round(PLOT["left"] + i * step, 1),
                "y": y(float(r.metrics.get(name, 0))),
                "value": float(r.metrics.get(name, 0)),
                "run": r.pk,
            }
            for i, r in enumerate(done)
        ]
        lines.append(
            {
                "name": name,
                "label": label,
                "color": color,
                "dash": dash,
                "points": points,
                "polyline": " ".join(f"{p['x']},{p['y']}" for p in points),
                "last": points[-1],
            }
        )
    every = max(1, len(done) // 10)  # at most about ten run labels on the x axis
    return {
        "lines": lines,
        "runs": len(done),
        "plot": PLOT,
        "y_ticks": [{"value": v, "y": y(v)} for v in (0, 0.25, 0.5, 0.75, 1)],
        "x_ticks": [
            {"run": r.pk, "x": round(PLOT["left"] + i * step, 1)}
            for i, r in enumerate(done)
            if i % every == 0 or i == len(done) - 1
        ],
    }


def _visible_runs(request):
    runs = Run.objects.order_by("-started_at", "-pk")
    if request.rag_collections is None:
        return runs
    allowed = request.rag_collections
    return Run.objects.filter(
        pk__in=[
            r.pk
            for r in runs.only("pk", "config")[:1000]
            if r.config.get("collections") and set(r.config["collections"]) <= allowed
        ]
    )


def _retriever_label(retriever) -> str:
    if isinstance(retriever, list):
        return "agent: " + ", ".join(
            step if isinstance(step, str) else str(step[0]) for step in retriever
        )
    return str(retriever)


def _highlighted(answer, grounding) -> list[dict]:
    """A case's answer cut by its grounded spans; [] when no span shows (the plain answer)."""
    segments = grounded_segments(answer, grounding)
    return segments if any(s["verdict"] for s in segments) else []


@dashboard_view
def evaluation_run(request, pk: int):
    """One run: its configuration, metrics, and every case's result, failures first."""
    run_ = get_object_or_404(_visible_runs(request), pk=object_id(pk))
    cases = []
    for record in run_.results:
        rank = record.get("first_relevant_rank")
        skipped = record.get("skipped")
        cases.append(
            {
                **record,
                "found": rank is not None and not skipped,
                "in_top_5": rank is not None and rank <= 5,
                "spans": _highlighted(record.get("answer"), record.get("grounding")),
            }
        )
    # Failures first: skipped, nothing relevant found, then found low, then the rest by rank.
    cases.sort(
        key=lambda c: (
            0 if c.get("skipped") else 1,
            c["found"],
            c.get("mrr", 0),
            c.get("recall_at_5", 0),
        )
    )
    metrics = [
        (label, run_.metrics.get(name))
        for name, label in [
            ("recall_at_1", "Recall@1"),
            ("recall_at_5", "Recall@5"),
            ("recall_at_10", "Recall@10"),
            ("hit_rate_at_5", "Hit rate@5"),
            ("precision_at_5", "Precision@5"),
            ("mrr", "MRR"),
            ("ndcg_at_10", "nDCG@10"),
        ]
        if run_.metrics.get(name) is not None
    ]
    return render(
        request,
        "django_rag/dashboard/evaluation_run.html",
        page_context(
            request,
            run=run_,
            cases=cases,
            metrics=metrics,
            failures=sum(1 for c in cases if not c["in_top_5"]),
            errors=sum(1 for c in cases if c.get("error")),
            judged=bool(run_.config.get("evaluate_answers")),
            correctness=_correctness(run_, cases),
            retriever=_retriever_label(run_.config.get("retriever", "search")),
            config_json=json.dumps(run_.config, indent=2, default=str),
        ),
    )

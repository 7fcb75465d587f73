"""The Ask page: one ask(), the agent pipeline with the ticked steps, or the loop, with the
work of every step; and the streamed single ask()."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from django.contrib import messages
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from ...agent import Agent
from ...agent.steps import STEPS
from ...conf import scrub_text
from ...exceptions import RagError
from ...streaming import StreamingResponse
from ..access import check_collection, dashboard_view
from ..forms import KINDS, AskForm
from ..trace import capture_spans, step_trace, timeline
from .ask_graph import graph_collections, graph_context
from .common import LLM_HINT, grounded_segments, llm_status, page_context, visible_collections


def _library_ask(question, **options):
    """The library's ask(), looked up on the views package when called:
    ``django_rag.dashboard.views.ask`` stays the one name to replace (tests wrap it there)."""
    return sys.modules[__package__].ask(question, **options)


NO_COLLECTION = (
    "You may not see any collection, so there is nothing to answer from. Ask an administrator "
    "for access (DJANGO_RAG['DASHBOARD']['COLLECTIONS'])."
)


def _ask_scope(request, data) -> list[str] | None:
    if data["collection"]:
        check_collection(request, data["collection"])
        return [data["collection"]]
    if request.rag_collections is not None:
        return sorted(request.rag_collections)
    return None


def _agent_scope(request, data, visible: list[str]) -> list[str] | None:
    """The collections the pipeline or loop may search: the chosen one, else every collection
    the user may see that exists (None: every collection, for an unrestricted user)."""
    if data["collection"]:
        check_collection(request, data["collection"])
        return [data["collection"]]
    if request.rag_collections is not None:
        return list(visible)
    return None


def _search_options(data) -> dict:
    options = {"mode": data["mode"]}
    if data.get("graph"):
        options["graph"] = True
    return options


def _run_pipeline(request, data, visible: list[str]) -> dict:
    """The agent with the ticked steps, in the registry's order (the search and the answer
    always run); returns the answer and each step's outputs as it declares them."""
    ticked = set(data["steps"])
    agent = Agent(
        data["question"],
        collection=_agent_scope(request, data, visible),
        limit=data["limit"],
        **_search_options(data),
    )
    ctx = agent.context
    trace = []
    for spec in STEPS.pipeline(ticked):
        flags = [flag for flag, _ in spec.flags if flag in ticked]
        getattr(agent, spec.name)(**dict.fromkeys(flags, True))
        trace.append(step_trace(spec, ctx, flags))
        if ctx.error is not None:
            break
    answer = agent.result
    chunks = _chunk_rows(ctx.chunks, kept={c.chunk_id for c in ctx.chunks})
    chunks += _chunk_rows(ctx.rerank_dropped, kept=set())
    work = {
        "kind": "pipeline",
        "steps": [name for row in trace for name in [row["name"], *row["flags"]]],
        "trace": trace,
        "warnings": list(ctx.warnings),
        "error": _ask_error(ctx.error) if ctx.error is not None else None,
        "failed_step": ctx.failed_step,
        "chunks": chunks,
        "usage": ctx.usage,
        "grounding": getattr(answer, "grounding", None) or ctx.grounding,
    }
    return {"answer": answer, "work": work}


def _chunk_rows(results, *, kept: set) -> list[dict]:
    return [{"result": r, "kept": r.chunk_id in kept, "source": source_name(r)} for r in results]


def source_name(result) -> str:
    """How a source is named on the Ask page: its document's title when it has one (with the
    pages), else its label (file name, source id...)."""
    return replace(result, filename="").label if result.title else result.label


def _chunk_url(result) -> str:
    return reverse("django_rag_dashboard:document", args=[int(result.document_id)]) + (
        f"#chunk-{int(result.chunk_id)}"
    )


def _score(value) -> float | None:
    return None if value is None else round(float(value), 4)


def stream_trailer(answer) -> dict:
    """The streamed single ask's trailer: what the other kinds show once the answer is
    complete, as data the page's script turns into DOM text (ids and numbers checked there)."""
    used = {c.chunk_id for c in answer.citations}
    return {
        "citations": [
            {
                "number": int(c.number),
                "label": source_name(c.chunk),
                "document_id": int(c.document_id),
                "chunk_id": int(c.chunk_id),
                "url": _chunk_url(c.chunk),
            }
            for c in answer.citations
        ],
        "chunks": [
            {
                "label": source_name(r),
                "document_id": int(r.document_id),
                "chunk_id": int(r.chunk_id),
                "collection": r.collection,
                "text": r.text[:160],
                "cited": r.chunk_id in used,
                "score": _score(r.score),
                "semantic_score": _score(r.semantic_score),
                "fulltext_score": _score(r.fulltext_score),
                "graph_score": _score(r.graph_score),
            }
            for r in answer.chunks
        ],
        "usage": answer.usage.to_dict(),
    }


def _run_loop(request, data, visible: list[str]) -> dict:
    from ...agent import Loop

    scope_names = _agent_scope(request, data, visible)
    result = Loop(
        data["question"],
        collection=scope_names,
        limit=data["limit"],
        max_iterations=data["max_iterations"],
        **_search_options(data),
    ).run()
    used = {c.chunk_id for c in result.chunks}
    work = {
        "kind": "loop",
        "tool_calls": result.tool_calls,
        "iterations": result.iterations,
        "stop_reason": result.stop_reason,
        "give_up_reason": result.give_up_reason,
        "collections": result.collections,
        "warnings": list(result.warnings),
        "error": _ask_error(result.error) if result.error is not None else None,
        "chunks": _chunk_rows(result.chunks, kept=used),
        "usage": result.usage,
        "grounding": getattr(result, "grounding", None),
    }
    return {"answer": result, "work": work}


def _run_ask(request, data, visible: list[str]) -> dict:
    """The Ask form's result: one ask(), the pipeline with the ticked steps, or the loop."""
    if data["kind"] == "pipeline":
        return _run_pipeline(request, data, visible)
    if data["kind"] == "loop":
        return _run_loop(request, data, visible)
    answer = _library_ask(
        data["question"],
        limit=data["limit"],
        collection=_ask_scope(request, data),
        **_search_options(data),
    )
    work = {
        "kind": "ask",
        "chunks": _chunk_rows(answer.chunks, kept={c.chunk_id for c in answer.chunks}),
        "usage": answer.usage,
        "grounding": getattr(answer, "grounding", None),
    }
    return {"answer": answer, "work": work}


def _no_collection(request, visible: list[str]) -> bool:
    """True when the user's scope holds no collection (nothing may be searched)."""
    return request.rag_collections is not None and not visible


#: Each way of answering and the URL name of its page; ``/ask/`` is the single ask too, and
#: reads the posted ``kind`` (links and forms made before the ways had pages keep working).
WAYS = {"ask": "ask", "pipeline": "ask_pipeline", "loop": "ask_loop"}


def _ways(current: str) -> list[dict]:
    return [
        {
            "kind": kind,
            "label": label,
            "url": reverse(f"django_rag_dashboard:{WAYS[kind]}"),
            "current": kind == current,
        }
        for kind, label in KINDS
    ]


@dashboard_view
def ask_page(request, way: str | None = None):
    """The Ask page; ``way`` (from the URL: ``/ask/pipeline/``, ``/ask/loop/``) fixes how the
    question is answered, whatever the form posts, so a page only ever shows its own way's
    result."""
    visible = list(visible_collections(request).values_list("name", flat=True))
    data = None
    if request.method == "POST":
        data = request.POST.copy()
        if way is not None:
            data["kind"] = way
    form = AskForm(data, collections=visible, initial={"kind": way or "ask"})
    outcome: dict = {}
    spans: list = []
    if request.method == "POST" and form.is_valid():
        if _no_collection(request, visible):
            messages.error(request, NO_COLLECTION)
        else:
            try:
                with capture_spans() as spans:
                    outcome = _run_ask(request, form.cleaned_data, visible)
            except Exception as exc:  # shown as a message: an LLM outage must not be a 500
                messages.error(request, _ask_error(exc))
    answer = outcome.get("answer")
    work = outcome.get("work")
    if work is not None:
        work["timeline"] = timeline(spans)
        work["graph"] = graph_context(
            work["chunks"],
            spans,
            getattr(answer, "graph", None),
            question=form.cleaned_data["question"],
            scope=_agent_scope(request, form.cleaned_data, visible),
        )
        if work.get("error"):
            messages.error(request, work["error"])
        work["citations"] = [
            {"citation": c, "source": source_name(c.chunk)}
            for c in (getattr(answer, "citations", None) or [])
        ]
        work["answer_segments"] = grounded_segments(
            answer.text if answer is not None else "", work.get("grounding")
        )
    current = way or (form.data.get("kind") if form.is_bound else None)
    if form.is_bound and form.is_valid():
        current = form.cleaned_data["kind"]
    current = current if current in WAYS else "ask"
    with_graph = graph_collections(request)
    chosen = form["collection"].value() or ""
    return render(
        request,
        "django_rag/dashboard/ask.html",
        page_context(
            request,
            form=form,
            way=current,
            ways=_ways(current),
            action=reverse(f"django_rag_dashboard:{WAYS[current]}"),
            graph_collections=with_graph,
            graph_shown=chosen in with_graph if chosen else bool(with_graph),
            answer=answer,
            work=work,
            document_url=_document_url(),
            llm=llm_status(),
            llm_hint=LLM_HINT,
        ),
    )


def _ask_error(exc: Exception) -> str:

    return scrub_text(f"{type(exc).__name__}: {exc}")[:1000]


def _document_url() -> str:
    """The document page's URL with ``0`` as its id: the Ask page's script puts in the ids
    the server sent (never a URL from the stream)."""
    return reverse("django_rag_dashboard:document", args=[0])


# Separates the streamed answer from its trailer; removed from the answer text.
TRAILER = "\x1e"


@require_POST
@dashboard_view
def ask_stream(request):
    """A single ask(), streamed: the answer text as it arrives, then the trailer.

    The trailer is the one record separator (``\\x1e``) of the body, after a newline, then
    JSON: when the answer is complete, :func:`stream_trailer` (``citations``, ``chunks`` and
    ``usage``); ``{"error": "..."}`` when it failed part way. The answer text never contains
    ``\\x1e`` (it is removed from every piece), so an LLM cannot forge the trailer; a body
    without a trailer was cut off.
    """
    from django.http import HttpResponseBadRequest

    visible = list(visible_collections(request).values_list("name", flat=True))
    form = AskForm(request.POST, collections=visible)
    if not form.is_valid():
        return HttpResponseBadRequest("Check the question and options.")
    data = form.cleaned_data
    if _no_collection(request, visible):
        return HttpResponseBadRequest(NO_COLLECTION)
    try:
        stream = _library_ask(
            data["question"],
            limit=data["limit"],
            collection=_ask_scope(request, data),
            stream=True,
            **_search_options(data),
        )
    except RagError as exc:
        return HttpResponseBadRequest(_ask_error(exc))

    def body():
        try:
            for piece in stream:
                piece = piece.replace(TRAILER, "")
                if piece:
                    yield piece
        except Exception as exc:  # a cut stream, a deadline, an outage: an error, not an answer
            yield "\n" + TRAILER + json.dumps({"error": _ask_error(exc)})
            return
        yield "\n" + TRAILER + json.dumps(stream_trailer(stream.answer))

    response = StreamingResponse(body(), content_type="text/plain; charset=utf-8")
    response["X-Accel-Buffering"] = "no"
    response["Cache-Control"] = "no-cache"
    return response


# --- background work: maintenance and evaluation ---------------------------------------------

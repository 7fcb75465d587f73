"""Dashboard views: thin wrappers over the library's services, scoped per user."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.db.models.functions import Substr
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from .. import background, sync
from ..agent import Agent, ask
from ..agent.steps import STEPS
from ..background import start
from ..conf import get_setting, scrub_text
from ..evaluation.runs import resolve_retriever
from ..exceptions import CollectionNotEmpty, InvalidOption, RagError
from ..ingestion.service import delete, ingest, ingest_bytes
from ..maintenance import find_orphans, remove_orphans
from ..maintenance import info as collect
from ..models import (
    Chunk,
    Collection,
    Community,
    Document,
    Entity,
    EntityMention,
    Job,
    Relationship,
    Run,
    TestCase,
)
from ..retrieval.service import normalize_mode
from ..retrieval.service import search as run
from .access import check_collection, dashboard_view, object_id, param, scope
from .forms import (
    AskForm,
    CollectionForm,
    DescriptionForm,
    IngestTextForm,
    SearchForm,
    UploadForm,
)


def _visible_collections(request):
    return scope(Collection.objects.order_by("name"), request, field="name")


def _context(request, **extra):
    documents = scope(Document.objects.all(), request)
    chunks = scope(Chunk.objects.all(), request)
    return {
        "stats": {"documents": documents.count(), "chunks": chunks.count()},
        "collections": list(_visible_collections(request).values_list("name", flat=True)),
        **extra,
    }


@dashboard_view
def home(request):
    return redirect("django_rag_dashboard:documents")


@dashboard_view
def documents(request):
    # The text can be megabytes: the list reads its first words only (untitled documents).
    items = (
        scope(Document.objects.select_related("collection"), request)
        .defer("content")
        .annotate(preview=Substr("content", 1, 200))
        .order_by("-created_at", "-pk")
    )
    collection = param(request, "collection")
    status = param(request, "status")
    source = param(request, "source")
    if collection:
        items = items.filter(collection__name=collection)
    if status:
        items = items.filter(status=status)
    if source:
        items = items.filter(source_id__icontains=source)
    page = Paginator(items, get_setting("DASHBOARD")["PAGE_SIZE"]).get_page(request.GET.get("page"))
    return render(
        request,
        "django_rag/dashboard/documents.html",
        _context(
            request,
            page=page,
            filters={"collection": collection, "status": status, "source": source},
            statuses=Document.Status.choices,
            ingest_form=IngestTextForm(),
            upload_form=UploadForm(),
        ),
    )


@dashboard_view
def document(request, pk: int):
    doc = get_object_or_404(
        scope(Document.objects.select_related("collection"), request), pk=object_id(pk)
    )
    chunks = doc.chunks.order_by("chunk_index")
    number = request.GET.get("page")
    if request.GET.get("chunk"):  # a link to one chunk (search, citations): the page holding it
        chunk = get_object_or_404(chunks, pk=object_id(request.GET["chunk"]))
        number = chunks.filter(chunk_index__lt=chunk.chunk_index).count() // CHUNKS_PER_PAGE + 1
    page = Paginator(chunks, CHUNKS_PER_PAGE).get_page(number)
    return render(
        request,
        "django_rag/dashboard/document.html",
        _context(request, document=doc, chunks=page, page=page),
    )


CHUNKS_PER_PAGE = 50


def _cancel_url(request) -> str:
    """Back to the page the form was on (same site only), else the dashboard's home."""
    from django.utils.http import url_has_allowed_host_and_scheme

    referer = request.META.get("HTTP_REFERER", "")
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return reverse("django_rag_dashboard:home")


def _confirm(request, *, title: str, message: str, button: str, details=None):
    """The confirmation page of a destructive POST, or None once it is confirmed.

    The page re-posts the same fields with ``confirmed=yes`` (plain HTML: no JavaScript).
    """
    if request.POST.get("confirmed") == "yes":
        return None
    fields = [
        (name, value)
        for name in request.POST
        if name not in ("csrfmiddlewaretoken", "confirmed")
        for value in request.POST.getlist(name)
    ]
    return render(
        request,
        "django_rag/dashboard/confirm.html",
        _context(
            request,
            title=title,
            message=message,
            button=button,
            details=details or [],
            fields=fields,
            action=request.get_full_path(),
            cancel=_cancel_url(request),
        ),
    )


def _back(request, default: str):
    return HttpResponseRedirect(reverse(f"django_rag_dashboard:{default}"))


@require_POST
@dashboard_view
def ingest_text(request):

    form = IngestTextForm(request.POST)
    if not form.is_valid():
        messages.error(
            request,
            "Check the form: "
            + "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()),
        )
        return _back(request, "documents")
    data = form.cleaned_data
    check_collection(request, data["collection"])
    try:
        doc = ingest(
            data["text"],
            collection=data["collection"],
            title=data["title"],
            source_id=data["source_id"] or None,
            format=data["format"],
        )
    except RagError as exc:
        messages.error(request, str(exc))
        return _back(request, "documents")
    messages.success(request, f"Ingested “{doc.title or doc.pk}”: {doc.chunk_count} chunks.")
    return redirect("django_rag_dashboard:document", pk=doc.pk)


@require_POST
@dashboard_view
def upload(request):
    """Store the upload and queue its job: the job parses it (in a child process whose memory is
    limited), chunks and embeds it. Nothing is parsed in this request's process."""
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
        return _back(request, "documents")
    check_collection(request, form.cleaned_data["collection"])
    upload = form.cleaned_data["file"]
    try:
        doc = ingest_bytes(
            upload.read(),
            filename=upload.name,
            collection=form.cleaned_data["collection"],
            source_id=form.cleaned_data["source_id"],  # the file name unless one was typed
            replace=form.cleaned_data["replace"],
            background=True,
        )
    except RagError as exc:
        # Inline jobs (BACKGROUND="inline") run here and raise their failure; the job and the
        # document are marked failed with it.
        messages.error(request, f"{upload.name}: {exc}")
        return _back(request, "documents")
    job = getattr(doc, "job", None)
    if job is not None and doc.status != Document.Status.COMPLETED:
        # Queued (thread pool, rag_worker or Celery): follow its progress on the jobs page.
        messages.info(request, f"{upload.name}: queued as job {job.pk}.")
        return HttpResponseRedirect(reverse("django_rag_dashboard:jobs") + f"?job={job.pk}")
    messages.success(
        request, f"{upload.name}: {doc.get_status_display().lower()}, {doc.chunk_count} chunks."
    )
    return redirect("django_rag_dashboard:document", pk=doc.pk)


@require_POST
@dashboard_view
def delete_document(request, pk: int):

    doc = get_object_or_404(scope(Document.objects.all(), request), pk=object_id(pk))
    if page := _confirm(
        request,
        title=f"Delete “{doc}”?",
        message="The document and its chunks are deleted; searches stop finding them. "
        "This cannot be undone.",
        details=[f"{doc.chunk_count} chunks", f"collection {doc.collection.name}"],
        button="Delete document",
    ):
        return page
    delete(doc)
    messages.success(request, f"Deleted “{doc}”.")
    return _back(request, "documents")


@dashboard_view
def collections(request, form=None):
    rows = _visible_collections(request).annotate(document_count=Count("documents", distinct=True))
    chunk_counts = dict(
        scope(Chunk.objects.all(), request).values_list("collection__name").annotate(n=Count("pk"))
    )
    return render(
        request,
        "django_rag/dashboard/collections.html",
        _context(
            request,
            rows=rows,
            chunk_counts=chunk_counts,
            form=form or CollectionForm(),
        ),
        status=200 if form is None else 400,
    )


@require_POST
@dashboard_view
def save_collection(request):
    """Create a collection (its name must be new), or, with ``existing``, edit a description."""
    if request.POST.get("existing"):
        form = DescriptionForm(request.POST)
        if not form.is_valid():
            messages.error(request, "Check the description.")
            return _back(request, "collections")
        name = form.cleaned_data["name"]
        check_collection(request, name)
        collection = get_object_or_404(Collection, name=name)
        collection.description = form.cleaned_data["description"]
        collection.save(update_fields=["description", "updated_at"])
        messages.success(request, f"Updated the description of “{name}”.")
        return _back(request, "collections")
    form = CollectionForm(request.POST)
    if form.is_valid():
        check_collection(request, form.cleaned_data["name"])
        Collection.objects.create(
            name=form.cleaned_data["name"], description=form.cleaned_data["description"]
        )
        messages.success(request, f"Created collection “{form.cleaned_data['name']}”.")
        return _back(request, "collections")
    return collections(request, form=form)


@require_POST
@dashboard_view
def delete_collection(request, pk: int):
    collection = get_object_or_404(_visible_collections(request), pk=object_id(pk))
    count = collection.documents.count()
    if count:
        messages.error(request, str(CollectionNotEmpty(collection.name, count)))
        return _back(request, "collections")
    if page := _confirm(
        request,
        title=f"Delete the collection “{collection.name}”?",
        message="It holds no documents; its description, graph and test cases go with it.",
        button="Delete collection",
    ):
        return page
    try:
        collection.delete()
    except CollectionNotEmpty as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Deleted collection “{collection.name}”.")
    return _back(request, "collections")


@dashboard_view
def search(request):

    visible = list(_visible_collections(request).values_list("name", flat=True))
    form = SearchForm(request.GET or None, collections=visible)
    columns = []
    if form.is_bound and form.is_valid() and form.cleaned_data["q"].strip():
        data = form.cleaned_data
        chosen = data["collection"] or (visible if request.rag_collections is not None else None)
        modes = (
            ["semantic", "fulltext", "hybrid"]
            if data["compare"]
            else [data["mode"] or form.fields["mode"].initial]
        )
        options = {"limit": data["limit"] or form.fields["limit"].initial, "collection": chosen}
        if data["semantic_weight"] is not None:
            options["semantic_weight"] = data["semantic_weight"]
        if data["fulltext_weight"] is not None:
            options["fulltext_weight"] = data["fulltext_weight"]
        for mode in modes:
            try:
                columns.append({"mode": mode, "results": run(data["q"], mode=mode, **options)})
            except RagError as exc:
                messages.error(request, str(exc))
                break
    elif form.is_bound and not form.is_valid():
        messages.error(
            request,
            "Check the search options: "
            + "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()),
        )
    return render(
        request, "django_rag/dashboard/search.html", _context(request, form=form, columns=columns)
    )


@dashboard_view
def info(request):

    data = collect()
    if request.rag_collections is not None:
        data["collections"] = [
            c for c in data["collections"] if c["name"] in request.rag_collections
        ]
    return render(
        request,
        "django_rag/dashboard/info.html",
        _context(
            request, info=data, settings_json=json.dumps(data["settings"], indent=2, default=str)
        ),
    )


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
    """The agent with the ticked steps; returns the answer and the work of every step."""
    scope_names = _agent_scope(request, data, visible)
    steps = set(data["steps"])
    agent = Agent(data["question"], limit=data["limit"], **_search_options(data))
    ctx = agent.context
    for name in ("gate", "rewrite"):
        if name in steps:
            getattr(agent, name)()
    offered = None
    if "select" in steps:
        offered = scope_names if scope_names is not None else visible
        agent.select(collections=offered)
    for name in ("expand", "decompose"):
        if name in steps:
            getattr(agent, name)()
    if "select" in steps and ctx.collections:
        agent.search()  # the selected collections, all inside the scope offered
    else:
        agent.search(collections=scope_names)
    searched = list(ctx.queries_tried)
    retrievals = [
        {"question": r.question, "collection": r.collection, "count": len(r.chunks)}
        for r in ctx.results
    ]
    if "reason" in steps:
        agent.reason()
    if "rerank" in steps:
        agent.rerank()
    agent.answer(self_correct="self_correct" in steps)
    # The grounding step exists only in versions of the agent that have it.
    ground = "ground" in steps and hasattr(Agent, "ground")
    if ground:
        agent.ground()
    answer = agent.result
    kept = {c.chunk_id for c in ctx.chunks}
    chunks = _chunk_rows(ctx.chunks, kept=kept)
    chunks += _chunk_rows(ctx.rerank_dropped, kept=set())
    work = {
        "kind": "pipeline",
        "steps": [name for name, _ in STEP_ORDER if name in steps or name in ("search", "answer")]
        + (["ground"] if ground else []),
        "gate": {
            "ran": "gate" in steps,
            "skip_retrieval": ctx.skip_retrieval,
            "reasoning": ctx.gate_reasoning,
        },
        "rewritten_query": ctx.rewritten_query,
        "expanded_query": ctx.expanded_query,
        "sub_questions": ctx.sub_questions,
        "select": {
            "ran": "select" in steps,
            "offered": offered,
            "chosen": ctx.collections,
            "reasoning": ctx.selection_reasoning,
        },
        "search": {
            "scope": ctx.search_scope,
            "queries": searched,
            "retrievals": retrievals,
            "iterations": ctx.search_iterations,
        },
        "reason": {
            "ran": "reason" in steps,
            "iterations": ctx.reason_iterations,
            "queries": [q for q in ctx.queries_tried if q not in searched],
        },
        "rerank": {
            "ran": "rerank" in steps,
            "kept": [c for c in chunks if c["kept"] and c["result"].rerank_score is not None],
            "dropped": _chunk_rows(ctx.rerank_dropped, kept=set()),
        },
        "corrections": ctx.corrections,
        "warnings": list(ctx.warnings),
        "error": _ask_error(ctx.error) if ctx.error is not None else None,
        "failed_step": ctx.failed_step,
        "chunks": chunks,
        "usage": ctx.usage,
        "grounding": getattr(answer, "grounding", None) or getattr(ctx, "grounding", None),
    }
    return {"answer": answer, "work": work}


STEP_ORDER = [
    ("gate", "Gate"),
    ("rewrite", "Rewrite"),
    ("select", "Select"),
    ("expand", "Expand"),
    ("decompose", "Decompose"),
    ("search", "Search"),
    ("reason", "Reason"),
    ("rerank", "Rerank"),
    ("answer", "Answer"),
    ("self_correct", "Self-correct"),
]


def _chunk_rows(results, *, kept: set) -> list[dict]:
    return [{"result": r, "kept": r.chunk_id in kept} for r in results]


def _run_loop(request, data, visible: list[str]) -> dict:
    from ..agent import Loop

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
    answer = ask(
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


@dashboard_view
def ask_page(request):
    from .trace import capture_spans, timeline

    visible = list(_visible_collections(request).values_list("name", flat=True))
    form = AskForm(request.POST or None, collections=visible)
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
        work["graph"] = _graph_context(work["chunks"], spans, getattr(answer, "graph", None))
        if work.get("error"):
            messages.error(request, work["error"])
        work["answer_segments"] = grounded_segments(
            answer.text if answer is not None else "", work.get("grounding")
        )
    return render(
        request,
        "django_rag/dashboard/ask.html",
        _context(
            request,
            form=form,
            answer=answer,
            work=work,
            step_names=dict(STEP_ORDER),
            document_url=_document_url(),
        ),
    )


def _graph_context(chunks: list[dict], spans: list[dict], given: dict | None) -> dict | None:
    """What the knowledge graph added: the searches it took part in, its chunks, and the
    entities, relationships and summaries given to the LLM (``Answer.graph``)."""
    searches = [
        s["metadata"] for s in spans if s["event"] == "search" and "graph_enhanced" in s["metadata"]
    ]
    graphed = [row for row in chunks if row["result"].graph_score is not None]
    if not searches and not graphed and not given:
        return None
    return {
        "entities": list((given or {}).get("entities") or []),
        "relationships": list((given or {}).get("relationships") or []),
        "summaries": list((given or {}).get("summaries") or []),
        "searches": len(searches),
        "enhanced": sum(1 for m in searches if m.get("graph_enhanced")),
        "match_scores": [m.get("graph_match_score") for m in searches],
        "chunks": graphed,
    }


VERDICTS = ("supported", "unsupported", "contradicted")


def grounded_segments(text: str, grounding) -> list[dict]:
    """The answer cut into pieces for display, each marked with the verdict of the grounded
    span covering it (None between spans). Spans are read duck-typed (``start``, ``end``,
    ``verdict``, ``chunk_ids``, ``score``); overlapping or out-of-range ones are clipped."""
    spans = []
    for item in getattr(grounding, "spans", None) or []:
        try:
            start, end = int(item.start), int(item.end)
        except (AttributeError, TypeError, ValueError):
            continue
        start, end = max(0, start), min(len(text), end)
        if end > start:
            spans.append((start, end, item))
    spans.sort(key=lambda entry: entry[0])
    segments, at = [], 0
    for start, end, item in spans:
        start = max(start, at)
        if end <= start:
            continue
        if start > at:
            segments.append({"text": text[at:start], "verdict": None})
        verdict = getattr(item, "verdict", None)
        score = getattr(item, "score", None)
        segments.append(
            {
                "text": text[start:end],
                "verdict": verdict if verdict in VERDICTS else "unsupported",
                "chunk_ids": list(getattr(item, "chunk_ids", None) or []),
                "score": score,
            }
        )
        at = end
    if at < len(text):
        segments.append({"text": text[at:], "verdict": None})
    return segments


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
    JSON: the list of citations (``number``, ``label``, integer ``document_id`` and
    ``chunk_id``, ``url``) when the answer is complete, or ``{"error": "..."}`` when it failed
    part way. The answer text never contains ``\\x1e`` (it is removed from every piece), so
    an LLM cannot forge the trailer; a body without a trailer was cut off.
    """
    from django.http import HttpResponseBadRequest, StreamingHttpResponse

    visible = list(_visible_collections(request).values_list("name", flat=True))
    form = AskForm(request.POST, collections=visible)
    if not form.is_valid():
        return HttpResponseBadRequest("Check the question and options.")
    data = form.cleaned_data
    if _no_collection(request, visible):
        return HttpResponseBadRequest(NO_COLLECTION)
    try:
        stream = ask(
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
        citations = [
            {
                "number": int(c.number),
                "label": c.chunk.label,
                "document_id": int(c.document_id),
                "chunk_id": int(c.chunk_id),
                "url": reverse("django_rag_dashboard:document", args=[int(c.document_id)])
                + f"#chunk-{int(c.chunk_id)}",
            }
            for c in stream.answer.citations
        ]
        yield "\n" + TRAILER + json.dumps(citations)

    response = StreamingHttpResponse(body(), content_type="text/plain; charset=utf-8")
    response["X-Accel-Buffering"] = "no"
    response["Cache-Control"] = "no-cache"
    return response


# --- background work: maintenance and evaluation ---------------------------------------------

JOB_LIMIT = 20


def _start(request, task: str, **params):
    """Start a background job; its failure (inline mode) becomes a message, never a 500."""

    try:
        job = start(task, **params)
    except Exception as exc:
        messages.error(request, f"{task.replace('_', ' ').capitalize()} failed: {exc}")
        return None
    if job.status == job.Status.COMPLETED:
        messages.success(request, f"{task.replace('_', ' ').capitalize()} finished (job {job.pk}).")
    else:
        messages.info(request, f"{task.replace('_', ' ').capitalize()} started as job {job.pk}.")
    return job


def _scoped_jobs(request):
    jobs = Job.objects.order_by("-created_at", "-pk")
    if request.rag_collections is not None:
        # A restricted user sees the jobs of their collections only.
        allowed = list(request.rag_collections)
        jobs = jobs.filter(
            Q(params__collection__in=allowed) | Q(params__options__collection__in=allowed)
        )
    return jobs


def _jobs(request, kinds):
    return _decorate(list(_scoped_jobs(request).filter(kind__in=kinds)[:JOB_LIMIT]))


def _decorate(jobs):
    """What the jobs table shows beyond the row: stalled, retryable, the result as rows."""
    after = background.describe().get("stalled_after_seconds") or 0
    for job in jobs:
        job.stalled = bool(after) and job.is_stalled(after)
        job.retryable = background.retryable(job, stalled_after=after)
        # Why a failed job offers no Retry (a superseded one says why in its own message).
        job.no_retry = (
            background.why_not_retryable(job)
            if job.status == Job.Status.FAILED and not job.retryable
            else ""
        )
        job.result_rows = _result_rows(job.result)
        job.duration_text = _duration(job.duration)
    return jobs


def _duration(delta) -> str:
    if delta is None:
        return ""
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _value(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "—"}[value]
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')}: {_value(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_value(v) for v in value[:20]) + (" …" if len(value) > 20 else "")
    return str(value)


def _result_rows(result) -> list[dict]:
    """A job's result as (label, value, link) rows: one per key, nested dicts flattened a
    level, a document id linked to its page."""
    if not isinstance(result, dict):
        return [{"label": "result", "value": _value(result), "url": ""}] if result else []
    rows = []
    for key, value in result.items():
        if isinstance(value, dict) and all(not isinstance(v, dict) for v in value.values()):
            for inner, v in value.items():
                rows.append(
                    {"label": f"{key} · {inner}".replace("_", " "), "value": _value(v), "url": ""}
                )
            continue
        url = ""
        if key == "document_id" and isinstance(value, int):
            url = reverse("django_rag_dashboard:document", args=[value])
        rows.append({"label": key.replace("_", " "), "value": _value(value), "url": url})
    return rows


# The filter's choices: every status a job row can have, and "stalled" (pending or running
# without a heartbeat).
JOB_STATUSES = [
    *(value for value in Job.Status.values if value != Job.Status.SUPERSEDED),
    "stalled",
    Job.Status.SUPERSEDED,
]


@dashboard_view
def jobs(request):
    """Every job the user may see, newest first, with progress, times, results and retries."""
    items = _scoped_jobs(request)
    status = param(request, "status")
    if status == "stalled":
        items = background.stalled(items)
    elif status in JOB_STATUSES:
        items = items.filter(status=status)
    page = Paginator(items, get_setting("DASHBOARD")["PAGE_SIZE"]).get_page(request.GET.get("page"))
    rows = _decorate(list(page.object_list))
    highlight = request.GET.get("job", "")
    query = request.GET.urlencode()
    context = {
        "jobs": rows,
        "page": page,
        "polling": _polling(rows),
        "jobs_url": reverse("django_rag_dashboard:jobs") + (f"?{query}" if query else ""),
        "highlight": int(highlight) if highlight.isdigit() else None,
        "background": background.describe(),
        "status": status,
        "statuses": JOB_STATUSES,
        "show_times": True,
    }
    if request.headers.get("HX-Request"):
        return render(request, "django_rag/dashboard/_jobs.html", context)
    return render(request, "django_rag/dashboard/jobs.html", _context(request, **context))


SYNC_JOBS = [Job.Kind.SYNC, Job.Kind.SYNC_ROW]


@dashboard_view
def sync_page(request):
    """Indexed models and synced folders: what is indexed, missing, pending, failed, and what
    the last check found stale; Check (a dry run) and Reconcile / Sync as background jobs."""
    allowed = request.rag_collections
    models = [row for row in sync.status() if allowed is None or row["collection"] in allowed]
    folders = _synced_folders(allowed)
    if request.method == "POST":
        return _sync_action(request, models, folders)
    checks = Job.objects.filter(
        kind=Job.Kind.SYNC, status=Job.Status.COMPLETED, params__dry_run=True
    ).order_by("-finished_at")
    for row in models:
        last = checks.filter(params__model=row["model"]).first()
        row["stale"] = _stale(last)
        row["checked_at"] = last.finished_at if last is not None else None
    jobs = _jobs(request, SYNC_JOBS)
    if request.headers.get("HX-Request"):
        return render(
            request,
            "django_rag/dashboard/_jobs.html",
            {
                "jobs": jobs,
                "polling": _polling(jobs),
                "jobs_url": reverse("django_rag_dashboard:sync"),
            },
        )
    return render(
        request,
        "django_rag/dashboard/sync.html",
        _context(
            request,
            models=models,
            folders=folders,
            jobs=jobs,
            polling=_polling(jobs),
            jobs_url=reverse("django_rag_dashboard:sync"),
        ),
    )


def _stale(check) -> int | None:
    """What a completed dry run found out of step (None: never checked)."""
    if check is None:
        return None
    return sum(check.result.get(key, 0) for key in ("added", "replaced", "updated", "deleted"))


def _synced_folders(allowed) -> list[dict]:
    """Each folder synced before (by rag_ingest --sync, sync_folder or a job): its last sync
    and its last check, newest first."""
    runs = Job.objects.filter(kind=Job.Kind.SYNC, params__has_key="folder").order_by(
        "-created_at", "-pk"
    )
    folders: dict[tuple, dict] = {}
    for job in runs[:500]:
        params = job.params
        if allowed is not None and params.get("collection") not in allowed:
            continue
        key = (params["folder"], params.get("collection"), params.get("prefix", ""))
        entry = folders.setdefault(
            key,
            {
                "id": len(folders),
                "folder": key[0],
                "collection": key[1],
                "prefix": key[2],
                "synced": None,
                "checked": None,
            },
        )
        slot = "checked" if params.get("dry_run") else "synced"
        if entry[slot] is None:
            entry[slot] = job
    for entry in folders.values():
        checked = entry["checked"]
        newer = (
            checked is not None
            and checked.status == Job.Status.COMPLETED
            and (entry["synced"] is None or checked.created_at > entry["synced"].created_at)
        )
        entry["stale"] = _stale(checked) if newer else None
    return list(folders.values())


def _sync_action(request, models, folders):
    action = request.POST.get("action", "")
    model = param(request, "model", method="POST", max_length=255)
    folder_id = param(request, "folder", method="POST", max_length=20)
    folder = next((f for f in folders if str(f["id"]) == folder_id), None) if folder_id else None
    row = next((m for m in models if m["model"] == model), None) if model else None
    if action not in ("check", "reconcile") or (row is None) == (folder is None):
        messages.error(request, "Unknown or forbidden action.")
        return redirect("django_rag_dashboard:sync")
    what = row["model"] if row else folder["folder"]
    if action == "reconcile" and (
        page := _confirm(
            request,
            title=f"Sync {what}?",
            message="New rows or files are indexed, changed ones replace their document "
            "(embedding them again), documents whose row or file is gone are deleted. "
            "Unchanged ones are left alone.",
            button="Sync",
        )
    ):
        return page
    dry_run = action == "check"
    if row is not None:
        scope_to = None if request.rag_collections is None else row["collection"]
        _start(request, "sync", model=row["model"], dry_run=dry_run, collection=scope_to)
    else:
        from ..ingestion.folders import folder_params

        params = folder_params(folder["folder"], folder["collection"], folder["prefix"], dry_run)
        _start(request, "sync", **params)
    return redirect("django_rag_dashboard:sync")


@require_POST
@dashboard_view
def retry_job(request, pk: int):
    """Queue a failed or stalled job again (the same work; the write path dedups it)."""
    job = get_object_or_404(_scoped_jobs(request), pk=object_id(pk))
    try:
        background.retry(job)
    except RagError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.pk} queued again.")
    return HttpResponseRedirect(reverse("django_rag_dashboard:jobs") + f"?job={job.pk}")


MAINTENANCE_JOBS = [
    Job.Kind.REEMBED,
    Job.Kind.REEMBED_TASK,
    Job.Kind.SWITCH,
    Job.Kind.BUILD_GRAPH,
    Job.Kind.DETECT_COMMUNITIES,
    Job.Kind.SUMMARIZE_COMMUNITIES,
]
EVALUATION_JOBS = [Job.Kind.RUN_EVALUATION, Job.Kind.GENERATE_TEST_CASES]


@dashboard_view
def maintenance(request):
    if request.method == "POST":
        action = request.POST.get("action", "")
        collection = param(request, "collection", method="POST", max_length=255) or None
        restricted = request.rag_collections is not None
        if collection:
            check_collection(request, collection)
        target = f"the collection “{collection}”" if collection else "every collection"
        if restricted and collection is None:
            messages.error(request, "Choose one of your collections.")
        elif action in CONFIRM_ACTIONS and (
            page := _confirm(
                request,
                title=CONFIRM_ACTIONS[action][0].format(target=target),
                message=CONFIRM_ACTIONS[action][1],
                button=CONFIRM_ACTIONS[action][2],
                details=_scope_figures(request, action, collection),
            )
        ):
            return page
        elif action == "reembed":
            _start(request, "reembed", options={"collection": collection, "batch_size": 64})
        elif action in ("build_graph", "detect_communities", "summarize_communities"):
            params = {"collection": collection}
            if action == "build_graph":
                params["resume"] = request.POST.get("resume") == "on"
            _start(request, action, **params)
        elif action == "orphans" and not restricted:
            return _clean_orphans(request)
        else:
            messages.error(request, "Unknown or forbidden action.")
        return redirect("django_rag_dashboard:maintenance")
    jobs = _jobs(request, MAINTENANCE_JOBS)
    template = (
        "django_rag/dashboard/_jobs.html"
        if request.headers.get("HX-Request")
        else ("django_rag/dashboard/maintenance.html")
    )
    return render(
        request,
        template,
        _context(
            request,
            jobs=jobs,
            polling=_polling(jobs),
            jobs_url=reverse("django_rag_dashboard:maintenance"),
        ),
    )


# Actions that replace stored data: (title, what happens, button) for the confirmation page.
CONFIRM_ACTIONS = {
    "reembed": (
        "Re-embed the chunks of {target}?",
        "Chunks embedded by another model than the configured one get new vectors; searches "
        "use them as each batch is stored. It reads every such chunk and calls the embedder.",
        "Re-embed",
    ),
    "build_graph": (
        "Rebuild the graph of {target}?",
        "Without “only new chunks”, the graph (entities, relationships, communities) is "
        "deleted and extracted again from every chunk: one extractor call (an LLM call with "
        "the default extractor) per chunk.",
        "Rebuild the graph",
    ),
    "detect_communities": (
        "Detect the communities of {target} again?",
        "The stored communities and their summaries are replaced.",
        "Detect communities",
    ),
    "summarize_communities": (
        "Summarise the communities of {target}?",
        "Every community's summary is written again by the LLM (one call per community).",
        "Summarise",
    ),
}


def _scope_figures(request, action: str, collection: str | None) -> list[str]:
    """What an action would touch, for its confirmation page (cheap counts, no model load)."""
    if request.POST.get("confirmed") == "yes":
        return []
    chunks = scope(Chunk.objects.all(), request)
    if collection:
        chunks = chunks.filter(collection__name=collection)
    if action == "reembed":
        from ..embeddings import get_embedder

        model = get_embedder().model_name
        stale = chunks.exclude(embedding_model=model).count()
        return [f"{stale} of {chunks.count()} chunks were embedded by another model than {model}"]
    if action == "build_graph":
        return [f"{chunks.count()} chunks in scope"]
    return []


def _clean_orphans(request):
    """Preview what the clean-up would remove; remove it once confirmed (like
    ``rag_maintenance orphans --apply``)."""
    found = find_orphans()
    labels = [f"{count} {name.replace('_', ' ')}" for name, count in found.items() if count]
    if not labels:
        messages.success(request, "No orphans: nothing to clean.")
        return redirect("django_rag_dashboard:maintenance")
    if page := _confirm(
        request,
        title="Remove these orphans?",
        message="Rows without a consistent parent, and a shadow column left by an abandoned "
        "model switch. They are deleted in one transaction; this cannot be undone.",
        details=labels,
        button="Remove orphans",
    ):
        return page
    removed = remove_orphans()
    messages.success(
        request,
        "Orphans removed: "
        + ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in removed.items()),
    )
    return redirect("django_rag_dashboard:maintenance")


def _polling(jobs) -> bool:
    return any(job.status in ("pending", "running") for job in jobs)


@dashboard_view
def evaluation(request):

    cases = scope(TestCase.objects.select_related("collection"), request)
    runs = list(_visible_runs(request)[:200])
    if request.method == "POST":
        action = request.POST.get("action")
        collection = param(request, "collection", method="POST", max_length=255) or None
        if action == "delete_case":
            case = get_object_or_404(cases, pk=object_id(request.POST.get("case")))
            if page := _confirm(
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
            _start(
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
            _start(request, "generate_test_cases", sample_size=size, collection=collection)
        return redirect("django_rag_dashboard:evaluation")
    jobs = _jobs(request, EVALUATION_JOBS)
    return render(
        request,
        "django_rag/dashboard/evaluation.html",
        _context(
            request,
            cases=cases.order_by("-created_at")[:50],
            case_count=cases.count(),
            runs=runs[:20],
            chart=_chart(list(reversed(runs[:30]))),
            jobs=jobs,
            polling=_polling(jobs),
            jobs_url=reverse("django_rag_dashboard:evaluation_jobs"),
            modes=["semantic", "fulltext", "hybrid"],
            retrievers=EVALUATION_RETRIEVERS,
            grounders=EVALUATION_GROUNDERS,
            default_steps="rewrite,search,answer",
            step_names=[name for name in STEPS if name != "global_answer"],
        ),
    )


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
    jobs = _jobs(request, EVALUATION_JOBS)
    return render(
        request,
        "django_rag/dashboard/_jobs.html",
        {
            "jobs": jobs,
            "polling": _polling(jobs),
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


def _answer_parts(answer, grounding) -> list[dict]:
    """The answer cut into plain and grounded parts (for highlighting); [] without spans."""
    if not answer or not grounding or not grounding.get("spans"):
        return []
    parts, at = [], 0
    for item in sorted(grounding["spans"], key=lambda s: s.get("start", 0)):
        start, end = int(item.get("start", 0)), int(item.get("end", 0))
        if start < at or end > len(answer) or end <= start:
            continue  # overlapping or out of range: shown as plain text
        if start > at:
            parts.append({"text": answer[at:start]})
        parts.append(
            {
                "text": answer[start:end],
                "verdict": item.get("verdict"),
                "chunk_ids": item.get("chunk_ids") or [],
            }
        )
        at = end
    if at < len(answer):
        parts.append({"text": answer[at:]})
    return parts


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
                "spans": _answer_parts(record.get("answer"), record.get("grounding")),
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
        _context(
            request,
            run=run_,
            cases=cases,
            metrics=metrics,
            failures=sum(1 for c in cases if not c["in_top_5"]),
            errors=sum(1 for c in cases if c.get("error")),
            judged=bool(run_.config.get("evaluate_answers")),
            retriever=_retriever_label(run_.config.get("retriever", "search")),
            config_json=json.dumps(run_.config, indent=2, default=str),
        ),
    )


GRAPH_NEIGHBOURS = 16


def _neighbourhood(entity, edges) -> list[dict]:
    """Positions of an entity's neighbours in a 600 x 300 diagram with the entity at the centre:
    half on a right arc, half on a left arc (never above or below it, where horizontal labels
    would collide), each label written outwards from its node."""
    import math

    right = edges[: (len(edges) + 1) // 2]
    left = edges[len(right) :]
    placed = []
    for side, group in ((1, right), (-1, left)):
        for i, edge in enumerate(group):
            # Spread from -65 to +65 degrees around the horizontal, top to bottom.
            angle = math.radians(-65 + 130 * (i + 0.5) / len(group))
            x = 300 + side * 120 * math.cos(angle)
            y = 150 + 125 * math.sin(angle)
            other = edge.target if edge.source_id == entity.pk else edge.source
            placed.append(
                {
                    "entity": other,
                    "type": edge.type,
                    "outgoing": edge.source_id == entity.pk,
                    "x": round(x, 1),
                    "y": round(y, 1),
                    "label_x": round(x + side * 9, 1),
                    "label_y": round(y + 4, 1),
                    "anchor": "start" if side == 1 else "end",
                }
            )
    return placed


@dashboard_view
def graph(request):
    tab = (
        request.GET.get("tab")
        if request.GET.get("tab") in ("relationships", "communities")
        else "entities"
    )
    q = param(request, "q").strip()
    entities = scope(Entity.objects.select_related("collection"), request)
    relationships = scope(
        Relationship.objects.select_related("source", "target"),
        request,
        field="source__collection__name",
    )
    communities = scope(Community.objects.select_related("collection"), request)
    collection = param(request, "collection")
    entity_type = param(request, "type") if tab == "entities" else ""
    if collection:
        check_collection(request, collection)
        entities = entities.filter(collection__name=collection)
        relationships = relationships.filter(source__collection__name=collection)
        communities = communities.filter(collection__name=collection)
    if tab == "entities":
        rows = entities.annotate(mention_count=Count("mentions", distinct=True))
        if q:
            rows = rows.filter(name__icontains=q)
        if entity_type:
            rows = rows.filter(type=entity_type)
        rows = rows.order_by("-mention_count", "name")
    elif tab == "relationships":
        rows = relationships
        if q:
            rows = rows.filter(
                Q(source__name__icontains=q) | Q(target__name__icontains=q) | Q(type__icontains=q)
            )
        rows = rows.order_by("-strength", "pk")
    else:
        rows = communities
        if q:
            rows = rows.filter(summary__icontains=q)
        rows = rows.order_by("level", "pk")
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    detail = None
    if request.GET.get("entity"):
        entity = get_object_or_404(entities, pk=object_id(request.GET["entity"]))
        around = relationships.filter(Q(source=entity) | Q(target=entity))
        edges = list(around.order_by("-strength", "pk")[:GRAPH_NEIGHBOURS])
        mentions = EntityMention.objects.filter(entity=entity).select_related("chunk")[:5]
        detail = {
            "entity": entity,
            "neighbours": _neighbourhood(entity, edges),
            "more": around.count() - len(edges),
            "mentions": mentions,
        }
    types = list(
        entities.values("type")
        .annotate(n=Count("pk"))
        .order_by("-n")
        .values_list("type", flat=True)[:20]
    )
    if entity_type and entity_type not in types:
        types.append(entity_type)  # the select keeps showing the filter in use
    # Every link of the page (pages, entities) carries the filters, so none is forgotten.
    kept = {"collection": collection, "q": q, "type": entity_type}
    filters = urlencode({"tab": tab, **{k: v for k, v in kept.items() if v}})
    entity_filters = urlencode({"tab": "entities", **{k: v for k, v in kept.items() if v}})
    return render(
        request,
        "django_rag/dashboard/graph.html",
        _context(
            request,
            tab=tab,
            page=page,
            detail=detail,
            q=q,
            selected=collection,
            types=types,
            entity_type=entity_type,
            filters=filters,
            entity_filters=entity_filters,
            graph_stats={
                "entities": entities.count(),
                "relationships": relationships.count(),
                "communities": communities.count(),
            },
        ),
    )

"""The Jobs page (every job, retries) and the Maintenance page (re-embed, graph builds,
orphans), which start background jobs."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from ... import background
from ...conf import get_setting, graph_setting
from ...exceptions import RagError
from ...graph import communities_to_summarize
from ...maintenance import embedding_config, find_orphans, remove_orphans
from ...models import Chunk, Job
from ...utils import plural
from ..access import check_collection, dashboard_view, object_id, param, scope
from .common import (
    LLM_HINT,
    confirm_page,
    decorate_jobs,
    jobs_of_kinds,
    llm_status,
    page_context,
    polling,
    scoped_jobs,
    start_job,
    visible_collections,
)

JOB_STATUSES = [
    *(value for value in Job.Status.values if value != Job.Status.SUPERSEDED),
    "stalled",
    Job.Status.SUPERSEDED,
]


@dashboard_view
def jobs(request):
    """Every job the user may see, newest first, with progress, times, results and retries."""
    items = scoped_jobs(request)
    status = param(request, "status")
    if status == "stalled":
        items = background.stalled(items)
    elif status in JOB_STATUSES:
        items = items.filter(status=status)
    page = Paginator(items, get_setting("DASHBOARD")["PAGE_SIZE"]).get_page(request.GET.get("page"))
    rows = decorate_jobs(list(page.object_list))
    highlight = request.GET.get("job", "")
    query = request.GET.urlencode()
    context = {
        "jobs": rows,
        "page": page,
        "polling": polling(rows),
        "jobs_url": reverse("django_rag_dashboard:jobs") + (f"?{query}" if query else ""),
        "highlight": int(highlight) if highlight.isdigit() else None,
        "background": background.describe(),
        "status": status,
        "statuses": JOB_STATUSES,
        "show_times": True,
    }
    if request.headers.get("HX-Request"):
        return render(request, "django_rag/dashboard/_jobs.html", context)
    return render(request, "django_rag/dashboard/jobs.html", page_context(request, **context))


@require_POST
@dashboard_view
def retry_job(request, pk: int):
    """Queue a failed or stalled job again (the same work; the write path dedups it)."""
    job = get_object_or_404(scoped_jobs(request), pk=object_id(pk))
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
        elif action == "summarize_communities" and (why := _no_summarizer()):
            messages.error(request, why)
        elif action in CONFIRM_ACTIONS and (
            page := confirm_page(
                request,
                title=CONFIRM_ACTIONS[action][0].format(target=target),
                message=CONFIRM_ACTIONS[action][1],
                button=CONFIRM_ACTIONS[action][2],
                details=_scope_figures(request, action, collection),
            )
        ):
            return page
        elif action == "reembed":
            start_job(request, "reembed", options={"collection": collection, "batch_size": 64})
        elif action in ("build_graph", "detect_communities", "summarize_communities"):
            params = {"collection": collection}
            if action == "build_graph":
                params["resume"] = request.POST.get("resume") == "on"
            start_job(request, action, **params)
        elif action == "orphans" and not restricted:
            return _clean_orphans(request)
        else:
            messages.error(request, "Unknown or forbidden action.")
        return redirect("django_rag_dashboard:maintenance")
    jobs = jobs_of_kinds(request, MAINTENANCE_JOBS)
    context = {
        "jobs": jobs,
        "polling": polling(jobs),
        "jobs_url": reverse("django_rag_dashboard:maintenance"),
    }
    if request.headers.get("HX-Request"):  # the jobs table's poll: nothing else is read
        return render(request, "django_rag/dashboard/_jobs.html", context)
    return render(
        request,
        "django_rag/dashboard/maintenance.html",
        page_context(
            request,
            **context,
            embedding=embedding_config(),
            to_summarize=_to_summarize(request),
            no_summarizer=_no_summarizer(),
        ),
    )


def _no_summarizer() -> str:
    """Why communities cannot be summarised (no LLM and no ``COMMUNITY_SUMMARIZER``), or ""."""
    if graph_setting("COMMUNITY_SUMMARIZER") is not None:
        return ""
    problem = llm_status()["problem"]
    return f"Summarising needs an LLM: {problem} {LLM_HINT}" if problem else ""


def _to_summarize(request) -> int | None:
    """How many communities “Summarise” would write now, in the user's collections (None when
    the summary settings are unusable: the job would say why)."""
    try:
        if request.rag_collections is None:
            return communities_to_summarize()
        names = visible_collections(request).values_list("name", flat=True)
        return sum(communities_to_summarize(name) for name in names)
    except RagError:
        return None


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
        from ...embeddings import get_embedder

        model = get_embedder().model_name
        stale = chunks.exclude(embedding_model=model).count()
        return [
            f"{stale} of {plural(chunks.count(), 'chunk')} were embedded by another model than {model}"
        ]
    if action == "build_graph":
        return [f"{plural(chunks.count(), 'chunk')} in scope"]
    return []


#: The orphans' kinds (django_rag.maintenance.find_orphans) as nouns, one and many.
ORPHAN_NOUNS = {
    "chunks_without_document": ("chunk without document", "chunks without document"),
    "chunks_in_wrong_collection": ("chunk in wrong collection", "chunks in wrong collection"),
    "stale_shadow_column": ("stale shadow column", "stale shadow columns"),
}


def _orphans(name: str, count: int) -> str:
    one, many = ORPHAN_NOUNS.get(name, (name.replace("_", " "),) * 2)
    return plural(count, one, many)


def _clean_orphans(request):
    """Preview what the clean-up would remove; remove it once confirmed (like
    ``rag_maintenance orphans --apply``)."""
    found = find_orphans()
    labels = [_orphans(name, count) for name, count in found.items() if count]
    if not labels:
        messages.success(request, "No orphans: nothing to clean.")
        return redirect("django_rag_dashboard:maintenance")
    if page := confirm_page(
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
        "Orphans removed: " + ", ".join(_orphans(name, count) for name, count in removed.items()),
    )
    return redirect("django_rag_dashboard:maintenance")

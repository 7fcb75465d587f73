"""The Documents pages: the list, one document and its chunks, paste, upload and delete."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models.functions import Substr
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from ...conf import get_setting
from ...exceptions import RagError
from ...graph.extractors import get_extractor
from ...ingestion.service import delete, ingest, ingest_bytes
from ...models import Document
from ...utils import plural
from ..access import check_collection, dashboard_view, object_id, param, scope
from ..forms import IngestTextForm, UploadForm
from .common import back_to, confirm_page, page_context, start_job


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
        page_context(
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
        page_context(request, document=doc, chunks=page, page=page),
    )


CHUNKS_PER_PAGE = 50


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
        return back_to(request, "documents")
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
        return back_to(request, "documents")
    messages.success(
        request, f"Ingested “{doc.title or doc.pk}”: {plural(doc.chunk_count, 'chunk')}."
    )
    return redirect("django_rag_dashboard:document", pk=doc.pk)


@require_POST
@dashboard_view
def upload(request):
    """Store the upload and queue its job: the job parses it (in a child process whose memory is
    limited), chunks and embeds it. Nothing is parsed in this request's process."""
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
        return back_to(request, "documents")
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
        return back_to(request, "documents")
    job = getattr(doc, "job", None)
    if job is not None and doc.status != Document.Status.COMPLETED:
        # Queued (thread pool, rag_worker or Celery): follow its progress on the jobs page.
        messages.info(request, f"{upload.name}: queued as job {job.pk}.")
        return HttpResponseRedirect(reverse("django_rag_dashboard:jobs") + f"?job={job.pk}")
    messages.success(
        request,
        f"{upload.name}: {doc.get_status_display().lower()}, {plural(doc.chunk_count, 'chunk')}.",
    )
    return redirect("django_rag_dashboard:document", pk=doc.pk)


@require_POST
@dashboard_view
def delete_document(request, pk: int):

    doc = get_object_or_404(scope(Document.objects.all(), request), pk=object_id(pk))
    if page := confirm_page(
        request,
        title=f"Delete “{doc}”?",
        message="The document and its chunks are deleted; searches stop finding them. "
        "This cannot be undone.",
        details=[plural(doc.chunk_count, "chunk"), f"collection {doc.collection.name}"],
        button="Delete document",
    ):
        return page
    delete(doc)
    messages.success(request, f"Deleted “{doc}”.")
    return back_to(request, "documents")


@require_POST
@dashboard_view
def build_document_graph(request, pk: int):
    """Extract the graph of one document's chunks not processed yet (``build_graph(document=)``)
    as a background job. A graph extractor that cannot be built is refused here, with why."""
    doc = get_object_or_404(
        scope(Document.objects.select_related("collection"), request), pk=object_id(pk)
    )
    try:
        extractor = get_extractor()
    except Exception as exc:  # a bad GRAPH['EXTRACTOR'] or a missing backend: say so
        messages.error(request, f"The graph cannot be built: {type(exc).__name__}: {exc}"[:600])
        return redirect("django_rag_dashboard:document", pk=doc.pk)
    job = start_job(
        request,
        "build_graph",
        label=f"Graph build of “{doc}” ({type(extractor).__name__})",
        collection=doc.collection.name,
        document=doc.pk,
    )
    if job is not None and job.status != job.Status.COMPLETED:
        return HttpResponseRedirect(reverse("django_rag_dashboard:jobs") + f"?job={job.pk}")
    return redirect("django_rag_dashboard:document", pk=doc.pk)

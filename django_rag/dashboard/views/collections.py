"""The Collections page: list, create, describe and delete collections."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Count
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from ...exceptions import CollectionNotEmpty
from ...models import Chunk, Collection
from ..access import check_collection, dashboard_view, object_id, scope
from ..forms import CollectionForm, DescriptionForm
from .common import back_to, confirm_page, page_context, visible_collections


@dashboard_view
def collections(request, form=None):
    rows = visible_collections(request).annotate(document_count=Count("documents", distinct=True))
    chunk_counts = dict(
        scope(Chunk.objects.all(), request).values_list("collection__name").annotate(n=Count("pk"))
    )
    return render(
        request,
        "django_rag/dashboard/collections.html",
        page_context(
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
            return back_to(request, "collections")
        name = form.cleaned_data["name"]
        check_collection(request, name)
        collection = get_object_or_404(Collection, name=name)
        collection.description = form.cleaned_data["description"]
        collection.save(update_fields=["description", "updated_at"])
        messages.success(request, f"Updated the description of “{name}”.")
        return back_to(request, "collections")
    form = CollectionForm(request.POST)
    if form.is_valid():
        check_collection(request, form.cleaned_data["name"])
        Collection.objects.create(
            name=form.cleaned_data["name"], description=form.cleaned_data["description"]
        )
        messages.success(request, f"Created collection “{form.cleaned_data['name']}”.")
        return back_to(request, "collections")
    return collections(request, form=form)


@require_POST
@dashboard_view
def delete_collection(request, pk: int):
    collection = get_object_or_404(visible_collections(request), pk=object_id(pk))
    count = collection.documents.count()
    if count:
        messages.error(request, str(CollectionNotEmpty(collection.name, count)))
        return back_to(request, "collections")
    if page := confirm_page(
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
    return back_to(request, "collections")

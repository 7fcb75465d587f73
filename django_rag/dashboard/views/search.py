"""The Search page: one mode, or the three side by side."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import render

from ...exceptions import RagError
from ...modes import MODES
from ...retrieval.service import search as run
from ..access import dashboard_view
from ..forms import SearchForm
from .common import page_context, visible_collections


@dashboard_view
def search(request):

    visible = list(visible_collections(request).values_list("name", flat=True))
    form = SearchForm(request.GET or None, collections=visible)
    columns = []
    if form.is_bound and form.is_valid() and form.cleaned_data["q"].strip():
        data = form.cleaned_data
        chosen = data["collection"] or (visible if request.rag_collections is not None else None)
        modes = list(MODES) if data["compare"] else [data["mode"] or form.fields["mode"].initial]
        options = {"limit": data["limit"] or form.fields["limit"].initial, "collection": chosen}
        if data["semantic_weight"] is not None:
            options["semantic_weight"] = data["semantic_weight"]
        if data["fulltext_weight"] is not None:
            options["fulltext_weight"] = data["fulltext_weight"]
        if data["threshold"] is not None:
            options["threshold"] = data["threshold"]
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
        request,
        "django_rag/dashboard/search.html",
        page_context(request, form=form, columns=columns),
    )

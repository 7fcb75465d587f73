"""The Info page: versions, settings and figures of the installation."""

from __future__ import annotations

import json

from django.shortcuts import render

from ...maintenance import info as collect
from ..access import dashboard_view
from .common import LLM_HINT, llm_status, page_context


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
        page_context(
            request,
            info=data,
            settings_json=json.dumps(data["settings"], indent=2, default=str),
            llm=llm_status(),
            llm_hint=LLM_HINT,
        ),
    )

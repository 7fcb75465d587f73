import importlib.util

from django.contrib import admin
from django.http import HttpResponse
from django.template import engines
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rag/", include("django_rag.dashboard.urls")),
]

CHAT_PAGE = """{% load django_rag_chat %}<!doctype html>
<html><head><title>Ask the sample corpus</title>{% rag_chat_assets %}</head>
<body style="font-family: sans-serif; margin: 2rem">
{% if user.is_authenticated %}{% rag_chat title="Ask the sample corpus" %}
{% else %}<p><a href="/admin/login/?next=/chat/">Log in</a> to chat.</p>{% endif %}
</body></html>"""


def chat(request):
    """A plain page with the embeddable chat box (docs/chat.md)."""
    return HttpResponse(engines["django"].from_string(CHAT_PAGE).render({}, request))


if importlib.util.find_spec("ninja") is not None:  # the "api" extra
    urlpatterns += [
        path("rag/api/", include("django_rag.api.urls")),
        path("chat/", chat),
    ]

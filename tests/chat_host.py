"""A plain page of a host project that embeds the chat box (tests/test_chat_browser.py)."""

from django.http import HttpResponse
from django.template import engines

PAGE = """{% load django_rag_chat %}<!doctype html>
<html><head><title>Help centre</title>{% rag_chat_assets %}</head>
<body style="font-family: sans-serif; margin: 2rem">
<h1>Help centre</h1>
<p>Ask our documents anything.</p>
{% rag_chat api_url="/rag/api/" collection="help" citation_url="/help/{source_id}/" title="Ask the help centre" %}
</body></html>"""


def host_page(request):
    template = engines["django"].from_string(PAGE)
    return HttpResponse(template.render({}, request))


def help_article(request, source_id):
    """The host's own page for a cited source: where the chat box's citation links lead."""
    from django.utils.html import escape

    from django_rag.models import Document

    doc = Document.objects.filter(source_id=source_id).first()
    title = escape(doc.title) if doc else "Not found"
    return HttpResponse(f"<!doctype html><title>{title}</title><h1>{title}</h1>")

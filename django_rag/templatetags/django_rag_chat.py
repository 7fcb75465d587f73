"""The embeddable chat box: ``{% load django_rag_chat %}``, ``{% rag_chat_assets %}`` in the
page's head and ``{% rag_chat %}`` where the box goes (docs/chat.md)."""

from __future__ import annotations

from django import template
from django.middleware.csrf import get_token
from django.templatetags.static import static
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _

from ..conf import get_setting

register = template.Library()


@register.simple_tag
def rag_chat_assets() -> str:
    """The box's stylesheet and script, served from the app's static files (no CDN, no build)."""
    return format_html(
        '<link rel="stylesheet" href="{}"><script src="{}" defer></script>',
        static("django_rag/chat/chat.css"),
        static("django_rag/chat/chat.js"),
    )


def _api_root() -> str:
    try:
        return reverse("django_rag_api:search").removesuffix("search")
    except NoReverseMatch:
        return ""


@register.inclusion_tag("django_rag/chat/box.html", takes_context=True)
def rag_chat(
    context,
    api_url: str | None = None,
    collection: str | None = None,
    citation_url: str | None = None,
    title: str | None = None,
    placeholder: str | None = None,
):
    """A chat box that streams answers from the API at ``api_url`` (default: where
    ``django_rag.api.urls`` is included), searching ``collection`` (default: every collection
    the visitor may read), with citations linked through ``citation_url`` (default
    ``CHAT["CITATION_URL"]``; ``{source_id}``, ``{document_id}``, ``{chunk_id}``,
    ``{collection}`` are filled in). The conversation is kept per user (or session) across
    page loads. Its own texts (buttons, the notes on a failed answer) are translated with
    Django's gettext; the API's error messages are the visitor's short texts."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        owner = f"u{user.pk}"
    elif request is not None and getattr(request, "session", None) is not None:
        if request.session.session_key is None:
            request.session.save()
        owner = "s" + request.session.session_key[:12]
    else:
        owner = "anonymous"
    if citation_url is None:
        citation_url = get_setting("CHAT")["CITATION_URL"]
    return {
        "api_url": api_url or _api_root(),
        "collection": collection or "",
        "citation_url": citation_url or "",
        "title": _("Ask our documents") if title is None else title,
        "placeholder": _("Ask a question…") if placeholder is None else placeholder,
        "csrf_token": get_token(request) if request is not None else "",
        "owner": owner,
    }

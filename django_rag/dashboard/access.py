"""Who may use the dashboard, and which collections each user sees."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import OperationalError
from django.http import Http404, HttpResponse, HttpResponseBadRequest

from ..access import can_manage, user_collections
from ..exceptions import ConfigurationError, RagError
from ..validation import MAX_PK, clean_string

logger = logging.getLogger(__name__)


def has_permission(user) -> bool:
    return can_manage(user)


def allowed_collections(request) -> set[str] | None:
    """The collection names this request's user may see, or None for all
    (:func:`django_rag.access.user_collections`, shared with the HTTP API)."""
    return user_collections(request.user)


def check_collection(request, name: str) -> None:
    """Refuse a collection outside the user's scope as if it did not exist."""
    allowed = request.rag_collections
    if allowed is not None and name not in allowed:
        raise Http404("No such collection.")


def scope(queryset, request, field: str = "collection__name"):
    allowed = request.rag_collections
    if allowed is None:
        return queryset
    return queryset.filter(**{f"{field}__in": allowed})


def param(request, name: str, *, method: str = "GET", max_length: int = 500) -> str:
    """A text parameter (a list filter, a collection name...): ``""`` when absent. One that
    PostgreSQL cannot compare (NUL, unpaired surrogate) or over ``max_length`` characters raises
    :class:`~django_rag.exceptions.InvalidOption`, which :func:`dashboard_view` answers with 400.
    """
    data = request.POST if method == "POST" else request.GET
    return clean_string(data.get(name) or "", name, max_length=max_length)


def object_id(value: Any) -> int:
    """A primary key from the URL or a parameter; anything but an id that can exist is a 404."""
    try:
        pk = int(value)
    except (TypeError, ValueError):  # not a number (or one with thousands of digits)
        raise Http404("No such object.") from None
    if not 1 <= pk <= MAX_PK:
        raise Http404("No such object.")
    return pk


def error_response(exc: RagError) -> HttpResponseBadRequest:
    """400 with the error's message (plain text: it may quote the user's input)."""
    if isinstance(exc, ConfigurationError):
        # Its message repeats the setting's value, which may hold a secret.
        logger.error("Dashboard request failed: DJANGO_RAG[%r] is invalid.", exc.setting)
        message = f"The server's DJANGO_RAG[{exc.setting!r}] setting is invalid; see its log."
    else:
        message = str(exc)
    return HttpResponseBadRequest(
        f"{message} ({exc.code})\n", content_type="text/plain; charset=utf-8"
    )


def login_url() -> str:
    """Where anonymous users log in: ``settings.LOGIN_URL`` when it resolves to a view of this
    project, else the Django admin's login (a fresh project has no ``/accounts/login/``)."""
    from django.conf import settings
    from django.shortcuts import resolve_url
    from django.urls import NoReverseMatch, Resolver404, resolve, reverse

    try:
        url = resolve_url(settings.LOGIN_URL)
    except NoReverseMatch:
        url = None
    if url:
        if "://" in url or url.startswith("//"):
            return url  # another site (single sign-on): trust the setting
        try:
            resolve(url.split("?", 1)[0])
            return url
        except Resolver404:
            pass
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return url or settings.LOGIN_URL


def dashboard_view(view: Callable[..., Any]) -> Callable[..., Any]:
    """Login required, then the dashboard permission; sets ``request.rag_collections``.

    A library error (:class:`~django_rag.exceptions.RagError`) that escapes the view is bad
    input: it becomes a 400 response with its message, never a 500. A database that cannot be
    reached (an ``OperationalError`` while connecting, even to read the session) is a 503 page
    saying so, with the command that starts the embedded server when the project uses one.
    """

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        try:
            return checked(request, *args, **kwargs)
        except OperationalError as exc:
            wrapper = connecting_wrapper(exc)
            if wrapper is None:  # the server answered, then a query failed: not this page
                raise
            return database_unreachable(wrapper, exc)

    def checked(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), login_url())
        if not has_permission(request.user):
            raise PermissionDenied("You may not use the RAG dashboard.")
        request.rag_collections = allowed_collections(request)
        try:
            return view(request, *args, **kwargs)
        except RagError as exc:
            return error_response(exc)

    return wrapped


def connecting_wrapper(exc: BaseException):
    """The database wrapper (``django.db.connections[alias]``) whose connection attempt raised
    ``exc``, or None when ``exc`` came from anything but opening a connection."""
    import traceback

    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name == "get_new_connection":
            wrapper = frame.f_locals.get("self")
            if hasattr(wrapper, "settings_dict"):
                return wrapper
    return None


def database_unreachable(wrapper, exc: BaseException) -> HttpResponse:
    """The 503 page of a database that cannot be reached: what to do, and with ``DEBUG`` the
    error and the embedded server's data directory (never shown to anyone otherwise: the page
    is served before the login is known)."""
    from django.conf import settings
    from django.template.loader import render_to_string

    from ..conf import scrub_text
    from ..embedded import embedded_data_directory

    data_dir = embedded_data_directory(wrapper.settings_dict)
    detail = scrub_text(
        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    )
    logger.error("Dashboard: the database %r cannot be reached: %s", wrapper.alias, detail)
    body = render_to_string(
        "django_rag/dashboard/unavailable.html",
        {
            "alias": wrapper.alias,
            "embedded": data_dir is not None,
            "data_dir": data_dir if settings.DEBUG else None,
            "detail": detail if settings.DEBUG else None,
        },
    )
    response = HttpResponse(body, status=503)
    response["Retry-After"] = "30"
    return response

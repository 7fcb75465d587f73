"""Who may use the dashboard, and which collections each user sees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404

from ..conf import get_setting, import_string


def _callable(name: str) -> Callable | None:
    value = get_setting("DASHBOARD")[name]
    if isinstance(value, str):
        value = import_string(value, setting=f"DASHBOARD.{name}")
    return value


def has_permission(user) -> bool:
    check = _callable("PERMISSION")
    if check is None:
        return bool(user.is_active and user.is_staff)
    return bool(check(user))


def allowed_collections(request) -> set[str] | None:
    """The collection names this user may see, or None for all. Fails closed: anything but
    None or an iterable of strings denies everything."""
    scope = _callable("COLLECTIONS")
    if scope is None:
        return None
    names = scope(request.user)
    if names is None:
        return None
    try:
        names = set(names)
    except TypeError:
        return set()
    return {name for name in names if isinstance(name, str)}


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


def dashboard_view(view: Callable[..., Any]) -> Callable[..., Any]:
    """Login required, then the dashboard permission; sets ``request.rag_collections``."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not has_permission(request.user):
            raise PermissionDenied("You may not use the RAG dashboard.")
        request.rag_collections = allowed_collections(request)
        return view(request, *args, **kwargs)

    return wrapped

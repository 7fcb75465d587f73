"""Who may read which collections: one rule shared by the dashboard and the HTTP API.

``DJANGO_RAG["DASHBOARD"]["COLLECTIONS"](user)`` scopes a user to collection names and
``DASHBOARD["PERMISSION"](user)`` says who may manage documents; both entry points ask here, so
a user sees the same collections in the dashboard, the API and the chat box.

Without a scope function the defaults are closed: the dashboard admits only users
``DASHBOARD["PERMISSION"]`` admits (active staff by default), who read every collection; the
API (and the chat box on it) lets active staff read every collection and everyone else
nothing, unless ``API["READ_ALL"]`` opens it (:func:`api_collections`). The MCP server has its
own list, ``MCP["COLLECTIONS"]``, empty by default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .conf import get_setting, import_string

logger = logging.getLogger("django_rag.access")


def _callable(name: str) -> Callable | None:
    value = get_setting("DASHBOARD")[name]
    if isinstance(value, str):
        value = import_string(value, setting=f"DASHBOARD.{name}")
    return value


def can_manage(user) -> bool:
    """Whether ``user`` may use the dashboard and change documents (default: active staff)."""
    check = _callable("PERMISSION")
    if check is None:
        return bool(user.is_active and user.is_staff)
    return bool(check(user))


def user_collections(user) -> set[str] | None:
    """The collection names ``user`` may read, or None for all.

    ``DASHBOARD["COLLECTIONS"](user)`` returns None (all), one collection name (a string: that
    collection, as ``collection=`` reads it everywhere) or an iterable of names. Anything else,
    or an iterable holding anything but strings, denies everything (fails closed) and logs an
    error naming the setting, so a broken scope function shows no collection rather than wrong
    ones (a string iterated would have given collections named by its characters)."""
    scope = _callable("COLLECTIONS")
    if scope is None:
        return None
    names = scope(user)
    if names is None:
        return None
    if isinstance(names, str):
        return {names}
    problem = None
    if isinstance(names, bytes | bytearray | dict):
        problem = f"a {type(names).__name__}"
    else:
        try:
            names = list(names)
        except TypeError:
            problem = f"a {type(names).__name__} (not iterable)"
        else:
            wrong = [name for name in names if not isinstance(name, str)]
            if wrong:
                problem = f"an iterable holding {type(wrong[0]).__name__} values"
    if problem is not None:
        logger.error(
            "DJANGO_RAG['DASHBOARD']['COLLECTIONS'] returned %s for user id %s; it must return "
            "None, a collection name or an iterable of names. The user sees no collection.",
            problem,
            getattr(user, "pk", None),
        )
        return set()
    return set(names)


def reads_everything(user) -> bool:
    """Whether ``user`` reads every collection through the API when ``DASHBOARD["COLLECTIONS"]``
    is not set: ``API["READ_ALL"]`` says who (None, the default, is ``"staff"``: active staff)."""
    rule = get_setting("API")["READ_ALL"] or "staff"
    if rule == "anyone":
        return True
    if not (user.is_authenticated and user.is_active):
        return False
    return rule == "authenticated" or bool(user.is_staff)


def api_collections(user) -> set[str] | None:
    """The collection names ``user`` may read through the HTTP API and the chat box, or None
    for all: ``DASHBOARD["COLLECTIONS"](user)`` when it is set (:func:`user_collections`),
    else all for whom :func:`reads_everything` allows and nothing for anyone else."""
    if _callable("COLLECTIONS") is None:
        return None if reads_everything(user) else set()
    return user_collections(user)

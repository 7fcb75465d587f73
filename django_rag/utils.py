"""Small helpers shared across django_rag's packages."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_loaded: dict[Hashable, Any] = {}
_lock = threading.Lock()


def load_once(key: Hashable, loader: Callable[[], T]) -> T:
    """Return the object cached under ``key``, calling ``loader`` once per process to make it.

    Used for models (embedders, rerankers, NER): loading is slow and the weights are shared
    by every component instance that names the same model and device.
    """
    try:
        return _loaded[key]
    except KeyError:
        pass
    with _lock:
        if key not in _loaded:
            _loaded[key] = loader()
        return _loaded[key]


def is_loaded(key: Hashable) -> bool:
    """Whether :func:`load_once` already made the object cached under ``key``."""
    return key in _loaded


# A file path in a library's message: two or more "/"-separated parts (a POSIX path, or one
# inside a Windows drive), or a Windows path with a drive letter.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.+~@-]+){2,}[\\/]?|[A-Za-z]:\\[^\s'\"]*")


def scrub_paths(text: str) -> str:
    """``text`` with file paths replaced by ``<path>``: a native library's error quotes its
    own source or ``site-packages`` path, which tells whoever ingested a file nothing and
    describes the server."""
    return _PATH.sub("<path>", text)


def call_arity(func: Callable[..., Any], *, most: int, what: str) -> int | None:
    """How many positional arguments to call ``func`` with, from 1 to ``most``: its required
    positional parameters (at least 1), ``most`` when it takes ``*args``; None when it has no
    signature (some builtins).

    Parameters with defaults, positional or keyword-only, are left to their defaults:
    ``def f(prompt, temperature=0.0)`` is called with one argument, as before arities
    existed, and a function that wants more makes them required. Raises
    :class:`~django_rag.exceptions.InvalidOption` (naming ``what``) for a function that takes
    no positional argument, needs more than ``most``, or needs a keyword-only argument.
    Inspect once, when the function is given, not on every call.
    """
    import inspect

    from .exceptions import InvalidOption

    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    name = getattr(func, "__qualname__", type(func).__name__)
    needs_keyword = [
        p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if needs_keyword:
        raise InvalidOption(
            f"{what} {name!r} needs the keyword argument(s) {', '.join(needs_keyword)}, which "
            "are never given: give them defaults"
        )
    if len(required) > most:
        raise InvalidOption(
            f"{what} {name!r} needs {len(required)} positional arguments; it is called with at "
            f"most {most}"
        )
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return most
    if not positional:
        raise InvalidOption(f"{what} {name!r} takes no positional argument; it needs at least one")
    return max(1, len(required))


def keyword_parameters(func: Callable[..., Any], *, skip: int = 0) -> frozenset[str] | None:
    """The names ``func`` accepts as keyword arguments after its first ``skip`` positional
    parameters; None when it takes ``**kwargs`` (any name)."""
    import inspect

    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return frozenset(
        p.name
        for p in parameters
        if p.kind is p.KEYWORD_ONLY
        or (p.kind is p.POSITIONAL_OR_KEYWORD and p not in positional[:skip])
    )


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` with its noun in the right number: "1 chunk", "2 chunks", "0 entities"
    (``many``: the plural when it is not the noun plus "s")."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"

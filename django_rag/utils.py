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


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` with its noun in the right number: "1 chunk", "2 chunks", "0 entities"
    (``many``: the plural when it is not the noun plus "s")."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"

"""Small helpers shared across django_rag's packages."""

from __future__ import annotations

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

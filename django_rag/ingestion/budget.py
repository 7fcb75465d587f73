"""The memory budget of one parse, as a bounded parse worker keeps it.

A leaf module: :mod:`~django_rag.ingestion.isolation` (which starts the workers) and the OCR
engine (which loads a model inside one) both use it, and it imports neither.

A worker limits its address space (``RLIMIT_AS``) to what it maps when it starts plus
``MAX_PARSE_MEMORY``. What a parse maps because of its input counts against that; what a
parser loads once, whatever the input (the OCR engine's models and thread pools), is loaded
:func:`outside_budget`: the soft limit is lifted while it loads and raised afterwards by what
it kept, so the budget left for the input stays what the setting says.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_state = {"worker": False, "start": 0, "charged": 0}

# How allocation failures read once a native library (MuPDF, onnxruntime, OpenCV, numpy)
# reports them in an exception's text.
_ALLOCATION_FAILURES = (
    "malloc (",
    "realloc (",
    "calloc (",
    "out of memory",
    "cannot allocate",
    "failed to allocate",
    "unable to allocate",
    "insufficient memory",
    "bad_alloc",
)


def in_worker() -> bool:
    """Whether this process is a bounded parse worker (a parse here is already bounded)."""
    return _state["worker"]


def mapped_bytes() -> int:
    """Bytes of address space this process maps now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def start_worker(budget: int) -> None:
    """Make this process a worker whose address space may grow by ``budget`` bytes."""
    import resource

    _state["worker"] = True
    _state["start"] = mapped = mapped_bytes()
    _state["charged"] = 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + budget  # not Linux (mapped 0): the budget alone, where it is enforced
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def grown() -> int:
    """Bytes this worker maps beyond its start and what it loaded outside the budget: what
    earlier parses left behind (freed memory the allocator kept)."""
    return max(0, mapped_bytes() - _state["start"] - _state["charged"])


@contextlib.contextmanager
def outside_budget() -> Iterator[None]:
    """Run a load that does not depend on the input (a model) without charging the parse:
    the soft limit is lifted while it runs, then raised by what it kept mapped. Outside a
    worker, nothing changes."""
    if not _state["worker"]:
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    before = mapped_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        yield
    finally:
        kept = max(0, mapped_bytes() - before)
        _state["charged"] += kept
        limit = soft + kept if soft != resource.RLIM_INFINITY else soft
        if hard != resource.RLIM_INFINITY and limit != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is an allocation failure: MemoryError, or a native
    library's "malloc (N bytes) failed" / "Failed to allocate" wrapped in another error."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno == 12:  # ENOMEM
            return True
        text = str(exc).lower()
        if any(sign in text for sign in _ALLOCATION_FAILURES):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False

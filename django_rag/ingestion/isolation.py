"""Parsing untrusted files in a child process whose memory is limited.

The parsers' budgets (:mod:`django_rag.ingestion.parsers`) refuse every amplification we know
of before extraction starts; what they cannot foresee (a new trick in a PDF, a parser a project
adds) must still not take the memory of the process that serves requests or runs other jobs.
:func:`parse_isolated` forks a child, limits its address space to what it already maps plus
``MAX_PARSE_MEMORY`` bytes (``RLIMIT_AS``), parses there and sends the result back as JSON.
The parent stops the child after ``PARSE_TIMEOUT`` (plus a grace period), so a parse that hangs
inside native code ends too.

Why a fork: the child starts at once (no interpreter to start, no settings to rebuild: a
project's parsers and ``override_settings`` in tests apply as they are), and it needs nothing
the fork leaves behind: it runs the parser on bytes it already holds, uses no thread or lock of
the parent (MuPDF calls hold the GIL, so no other thread was inside MuPDF at the fork), never
touches the parent's database connections (it is given none) and leaves with ``os._exit``
(nothing of the parent's is flushed, closed or collected).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import warnings

from ..exceptions import CorruptFile, DocumentTooLarge, RagError
from .parsers import Page, ParsedDocument, _limit, get_parser, parse_bytes

# Seconds the parent waits past PARSE_TIMEOUT before it stops the child (the parser checks the
# budget itself between pages; this is for a parse stuck inside one page).
GRACE_SECONDS = 10
# Objects of the parent (its database connections) the child must neither use nor close.
_INHERITED: list = []


def can_isolate() -> bool:
    """Whether this platform can fork and limit a child's address space (POSIX)."""
    try:
        import resource  # noqa: F401
    except ImportError:
        return False
    return hasattr(os, "fork")


def parse_isolated(data: bytes, *, filename: str) -> ParsedDocument:
    """:func:`~django_rag.ingestion.parsers.parse_bytes` in a child process limited to
    ``MAX_PARSE_MEMORY`` bytes more than it starts with (in this process when that is None or
    the platform cannot fork). The parser's typed errors come back as they were raised; a
    child that runs out of memory raises :class:`DocumentTooLarge` (``MAX_PARSE_MEMORY``), one
    past ``PARSE_TIMEOUT`` raises :class:`DocumentTooLarge` (``PARSE_TIMEOUT``), one that
    crashes raises :class:`CorruptFile`."""
    budget = _limit("MAX_PARSE_MEMORY")
    if budget is None or not can_isolate():
        return parse_bytes(data, filename=filename)
    timeout = _limit("PARSE_TIMEOUT", integer=False)
    get_parser(filename)  # an unsupported type fails here; the parser's module is loaded
    deadline = None if timeout is None else time.monotonic() + timeout + GRACE_SECONDS
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a threaded process; see the module docstring.
        warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read_end)
            _child(write_end, data, filename, budget)
        finally:
            os._exit(0)
    os.close(write_end)
    payload, timed_out = None, False
    try:
        payload, timed_out = _read_all(read_end, deadline)
    finally:
        os.close(read_end)
        if payload is None or timed_out:
            _kill(pid)
    status = _reap(pid)
    if timed_out:
        raise DocumentTooLarge(
            f"{filename}: reading its text took more than PARSE_TIMEOUT ({timeout} s), so it "
            "was stopped. Split the file, or raise DJANGO_RAG['PARSE_TIMEOUT'] (seconds).",
            filename=filename,
            setting="PARSE_TIMEOUT",
            limit=timeout,
        )
    return _outcome(payload, status, filename=filename, budget=budget)


def _read_all(fd: int, deadline: float | None) -> tuple[bytes | None, bool]:
    """Everything the child writes, or (None, True) once ``deadline`` passes. ``poll``, not
    ``select``: a busy server's descriptor numbers can pass select's 1,024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks = []
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        if not poller.poll(wait):
            return None, True
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
            return 0


def _limit_address_space(budget: int) -> None:
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        mapped = 0  # not Linux: the budget alone (RLIMIT_AS may not be enforced there)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _child(fd: int, data: bytes, filename: str, budget: int) -> None:
    """Parse in the child and write one JSON message: the document, or what went wrong."""
    try:
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            # The parent's sockets: keep them referenced (never closed from here) and let the
            # child open its own should a parser use the database.
            _INHERITED.append(connection.connection)
            connection.connection = None
    except Exception:
        pass
    try:
        _limit_address_space(budget)
        parsed = parse_bytes(data, filename=filename)
        message = {
            "text": parsed.text,
            "format": parsed.format,
            "content_type": parsed.content_type,
            "title": parsed.title,
            "pages": [[page.number, page.start, page.end] for page in parsed.pages],
            "metadata": parsed.metadata,
        }
    except MemoryError:
        message = {"memory": True}
    except RagError as exc:
        message = {"memory": True} if _out_of_memory(exc) else _error(exc)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        if _out_of_memory(exc):
            message = {"memory": True}
        else:
            message = {"crash": f"{type(exc).__name__}: {exc}"[:2000]}
    del data
    try:
        payload = json.dumps(message, default=str).encode()
    except MemoryError:
        payload = b'{"memory": true}'
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


# How allocation failures read once MuPDF (or another native library) reports them.
_ALLOCATION_FAILURES = ("malloc (", "realloc (", "calloc (", "out of memory", "cannot allocate")


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is an allocation failure: MemoryError, or MuPDF's
    "malloc (N bytes) failed" wrapped in a parser's error."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, MemoryError):
            return True
        text = str(exc).lower()
        if any(sign in text for sign in _ALLOCATION_FAILURES):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _error(exc: RagError) -> dict:
    cls = type(exc)
    try:
        details = json.loads(json.dumps(exc.details, default=str))
    except (TypeError, ValueError):
        details = {}
    return {
        "error": [cls.__module__, cls.__name__],
        "message": exc.message,
        "details": details,
    }


def _outcome(payload: bytes | None, status: int, *, filename: str, budget: int) -> ParsedDocument:
    message = None
    if payload:
        try:
            message = json.loads(payload)
        except ValueError:
            message = None
    if message is None or "crash" in message:
        how = f"signal {-status}" if status < 0 else (message or {}).get("crash", "no result")
        raise CorruptFile(
            f"{filename}: the parser stopped without a result ({how}). The file is damaged, or "
            f"needed more memory than MAX_PARSE_MEMORY ({budget:,} bytes) allows.",
            filename=filename,
        )
    if message.get("memory"):
        raise DocumentTooLarge(
            f"{filename}: reading it needed more than MAX_PARSE_MEMORY ({budget:,} bytes) of "
            "memory, so it was stopped. The file may be hostile; if it is not, raise "
            "DJANGO_RAG['MAX_PARSE_MEMORY'].",
            filename=filename,
            setting="MAX_PARSE_MEMORY",
            limit=budget,
        )
    if "error" in message:
        raise _rebuild(message)
    return ParsedDocument(
        text=message["text"],
        format=message["format"],
        content_type=message["content_type"],
        title=message["title"],
        pages=[Page(*page) for page in message["pages"]],
        metadata=message["metadata"],
    )


def _rebuild(message: dict) -> RagError:
    """The child's typed error, as its class (a RagError subclass) with message and details."""
    module, name = message["error"]
    # Only a class this process has loaded (the parser's module was loaded before the fork):
    # the child's message never makes this process import anything.
    cls = getattr(sys.modules.get(module), name, RagError)
    if not (isinstance(cls, type) and issubclass(cls, RagError)):
        cls = RagError
    error = cls.__new__(cls)
    Exception.__init__(error, message["message"])
    error.message = message["message"]
    error.details = message.get("details") or {}
    return error

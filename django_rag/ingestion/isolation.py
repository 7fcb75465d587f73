"""One bounded parse for every entry point: untrusted input is parsed in worker processes whose
memory and time are limited.

The parsers' budgets (:mod:`django_rag.ingestion.parsers`) refuse every amplification we know
of before extraction starts; what they cannot foresee (a new trick in a PDF, a parser a project
adds, a library that is quadratic somewhere) must still not take the memory or the time of the
process that serves requests, runs jobs or walks a folder. So every parse of input nobody
vetted, whatever the entry point (an upload's job, ``ingest_file``, ``ingest_bytes``,
``ingest_files``, ``rag_ingest``, ``sync_folder``, HTML text given to ``ingest`` or a model
registered with ``format="html"``), goes through :func:`parse_isolated`,
:func:`parse_file_isolated` or :func:`html_to_markdown_isolated`, which run it in a worker:

* the worker's address space may grow by ``MAX_PARSE_MEMORY`` bytes past what it maps when it
  starts (``RLIMIT_AS``); a parse that needs more fails with :class:`DocumentTooLarge` naming
  the setting;
* the caller stops a parse ``GRACE_SECONDS`` after ``PARSE_TIMEOUT`` (the parsers check the
  budget themselves between pages and passes; this is for a parse stuck inside one), and the
  worker's CPU time is limited too (``RLIMIT_CPU``), so a worker whose caller died stops;
* the result comes back as JSON: text, pages, metadata, or the parser's typed error.

Workers are kept in a small pool and reused, so a folder of thousands of small files pays for
one fork, not one per file. A worker is replaced after ``WORKER_MAX_TASKS`` parses, after any
parse that ran out of memory, time or crashed, when freed memory its allocator kept passes a
quarter of the budget, after ``WORKER_IDLE_SECONDS`` unused, and whenever ``DJANGO_RAG``
changes (a worker holds the settings and parsers of the moment it was forked).

Why a fork: the worker starts at once (no interpreter to start, no settings to rebuild: a
project's parsers and ``override_settings`` in tests apply as they are), and it needs nothing
the fork leaves behind: it parses bytes it is sent, uses no thread or lock of the parent
(logging re-creates its locks at a fork), never touches the parent's database connections (it
is given none) and leaves with ``os._exit`` (nothing of the parent's is flushed, closed or
collected). Its signal handlers are reset, so a server's handlers never run in it.

``MAX_PARSE_MEMORY = None`` (or a platform without ``fork`` and ``RLIMIT_AS``) parses in the
calling process: the one opt-out, for trusted input.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from django.core.signals import setting_changed

from ..exceptions import CorruptFile, DocumentTooLarge, InvalidOption, RagError
from . import budget as memory
from .parsers import Page, ParsedDocument, get_parser, parse_bytes, parse_file
from .parsers.base import budget_setting

# Seconds the caller waits past PARSE_TIMEOUT before it stops the worker.
GRACE_SECONDS = 10
# Idle workers kept for the next parse (more may run at once: one per parsing thread).
POOL_SIZE = 2
# Parses one worker serves before it is replaced (bounds what a long-lived one accumulates).
WORKER_MAX_TASKS = 200
# A worker unused this long is replaced at the next parse; the worker itself leaves a minute
# later (so it never leaves while a request is on its way to it).
WORKER_IDLE_SECONDS = 60.0
_WORKER_EXIT_SECONDS = WORKER_IDLE_SECONDS + 60.0
# Objects of the parent (its database connections) a worker must neither use nor close.
_INHERITED: list = []
_HEADER = 16  # two 8-byte lengths frame every message: header (JSON), payload (bytes)


def can_isolate() -> bool:
    """Whether this platform can fork and limit a child's address space (POSIX)."""
    try:
        import resource  # noqa: F401
    except ImportError:
        return False
    return hasattr(os, "fork")


def _budget() -> int | None:
    """``MAX_PARSE_MEMORY`` when parses go to a worker; None to parse here (the opt-out, no
    fork on this platform, or this process is a worker already)."""
    budget = budget_setting("MAX_PARSE_MEMORY")
    if budget is None or memory.in_worker() or not can_isolate():
        return None
    return budget


# --- the entry points ------------------------------------------------------------------------


def parse_isolated(
    data: bytes, *, filename: str, options: dict[str, Any] | None = None
) -> ParsedDocument:
    """:func:`~django_rag.ingestion.parsers.parse_bytes` in a worker limited to
    ``MAX_PARSE_MEMORY`` bytes more than it starts with (in this process when that is None or
    the platform cannot fork). The parser's typed errors come back as they were raised; a
    parse that runs out of memory raises :class:`DocumentTooLarge` (``MAX_PARSE_MEMORY``), one
    past ``PARSE_TIMEOUT`` raises :class:`DocumentTooLarge` (``PARSE_TIMEOUT``), one that
    crashes raises :class:`CorruptFile`. ``options`` go to the parser (see
    :func:`~django_rag.ingestion.parsers.get_parser`); they must be JSON values."""
    budget = _budget()
    if budget is None:
        return parse_bytes(data, filename=filename, options=options)
    # An unsupported type, bad options or a missing extra fail here, before a worker is
    # asked; the parser's module is loaded.
    options = _sendable(options)
    get_parser(filename, options=options)
    header = {"op": "bytes", "filename": filename, "options": options}
    message = _run(header, bytes(data), filename, budget)
    return _document(message)


def parse_file_isolated(
    path: str | Path, *, options: dict[str, Any] | None = None
) -> ParsedDocument:
    """:func:`~django_rag.ingestion.parsers.parse_file` in a worker, as
    :func:`parse_isolated`: the worker opens and reads the file, so this process never holds
    its bytes. ``OSError`` (permissions) comes back as raised."""
    path = Path(path)
    budget = _budget()
    if budget is None:
        return parse_file(path, options=options)
    options = _sendable(options)
    get_parser(path.name, options=options)  # fails before the file is read
    try:
        cwd = os.getcwd()  # a worker forked earlier resolves a relative path from here
    except OSError:  # this directory was removed: only an absolute path can be found
        cwd = None
    header = {"op": "file", "path": str(path), "cwd": cwd, "options": options}
    return _document(_run(header, b"", path.name, budget))


def _sendable(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``options`` as the worker will receive them (a JSON round trip); anything else raises
    :class:`~django_rag.exceptions.InvalidOption`."""
    if options is None:
        return None
    try:
        return json.loads(json.dumps(options))
    except (TypeError, ValueError) as exc:
        raise InvalidOption(
            f"Parser options must be JSON values (they go to a worker): {exc}"
        ) from None


def html_to_markdown_isolated(html: str, *, main_content: bool = False) -> str:
    """:func:`~django_rag.ingestion.parsers.html.html_to_markdown` in a worker: HTML given as
    text (``ingest(html, format="html")``, a model registered with ``format="html"``) is
    converted under the same budgets as a file."""
    from .parsers.html import check_markup_size, html_to_markdown

    check_markup_size(html)
    budget = _budget()
    if budget is None:
        return html_to_markdown(html, main_content=main_content)
    if not html.strip():
        return ""
    payload = html.encode("utf-8", "surrogatepass")
    message = _run({"op": "html", "main_content": bool(main_content)}, payload, "HTML", budget)
    return message["markdown"]


def reset_pool() -> None:
    """Stop the idle workers; busy ones are replaced when their parse ends. Called when
    ``DJANGO_RAG`` changes; call it after changing a parser's code or module state at run time
    (tests that patch a parser) so the next parse forks a worker that sees the change."""
    with _pool.lock:
        _pool.generation += 1
        idle, _pool.idle = _pool.idle, []
    for worker in idle:
        worker.stop()


def worker_pids() -> list[int]:
    """The pids of this process's live parse workers (idle and busy)."""
    with _pool.lock:
        return sorted(_pool.live)


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "DJANGO_RAG":
        reset_pool()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_rag.isolation.reset_pool")


# --- the pool (this process's side) ------------------------------------------------------------


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.live: dict[int, _Worker] = {}
        self.generation = 0


_pool = _Pool()


def _after_fork_in_child() -> None:
    """In any child forked from this process (a worker, a Celery or multiprocessing child):
    the workers are the parent's, not its own. Close its copies of their pipes (a copy held
    open would hide a worker's death from the parent) and start with an empty pool."""
    global _pool
    for worker in list(_pool.live.values()):
        for fd in (worker.requests, worker.replies):
            try:
                os.close(fd)
            except OSError:
                pass
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Worker:
    """A forked worker and the two pipes to it. Created under the pool's lock, so no other
    worker's pipes are open in this process and unknown to the pool while it forks."""

    def __init__(self, budget: int, generation: int):
        self.budget = budget
        self.generation = generation
        self.tasks = 0
        self.last_used = time.monotonic()
        self.reaped: int | None = None
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a threaded process; see the module docstring.
            warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.close(requests_write)
                os.close(replies_read)
                _serve(requests_read, replies_write, budget)
            finally:
                os._exit(0)
        os.close(requests_read)
        os.close(replies_write)
        self.pid, self.requests, self.replies = pid, requests_write, replies_read

    def alive(self) -> bool:
        if self.reaped is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
            self.reaped = 0
            return False
        if pid == 0:
            return True
        self.reaped = os.waitstatus_to_exitcode(status)
        return False

    def send(self, header: dict, payload: bytes) -> None:
        head = json.dumps(header).encode()
        _write_all(
            self.requests, len(head).to_bytes(8, "big") + len(payload).to_bytes(8, "big") + head
        )
        _write_all(self.requests, payload)

    def receive(self, deadline: float | None) -> tuple[bytes | None, int, bool]:
        """The reply and the worker's memory growth, or (None, 0, False) when the worker ended
        without one, or (None, 0, True) once ``deadline`` passes."""
        lengths, timed_out = _read_exact(self.replies, _HEADER, deadline)
        if lengths is None:
            return None, 0, timed_out
        size, grown = int.from_bytes(lengths[:8], "big"), int.from_bytes(lengths[8:], "big")
        body, timed_out = _read_exact(self.replies, size, deadline)
        return body, grown, timed_out

    def stop(self) -> int | None:
        """Close the pipes, kill the worker, reap it; its exit code (negative: a signal).
        Safe to call twice."""
        with _pool.lock:
            _pool.live.pop(self.pid, None)
        fds, self.requests, self.replies = (self.requests, self.replies), -1, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self.reaped is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reaped = _reap(self.pid)
        return self.reaped


def _checkout(budget: int) -> _Worker:
    stale = []
    with _pool.lock:
        now = time.monotonic()
        worker = None
        while _pool.idle:
            candidate = _pool.idle.pop()  # the most recently used: its pages are warm
            if (
                candidate.budget == budget
                and candidate.generation == _pool.generation
                and now - candidate.last_used < WORKER_IDLE_SECONDS
                and candidate.alive()
            ):
                worker = candidate
                break
            stale.append(candidate)
        if worker is None:
            worker = _Worker(budget, _pool.generation)
            _pool.live[worker.pid] = worker
    for candidate in stale:
        candidate.stop()
    return worker


def _checkin(worker: _Worker, grown: int) -> None:
    worker.tasks += 1
    worker.last_used = time.monotonic()
    with _pool.lock:
        keep = (
            worker.tasks < WORKER_MAX_TASKS
            and grown <= worker.budget // 4
            and worker.generation == _pool.generation
            and len(_pool.idle) < POOL_SIZE
        )
        if keep:
            _pool.idle.append(worker)
    if not keep:
        worker.stop()


def _run(header: dict, payload: bytes, label: str, budget: int) -> dict:
    """Send one request to a worker; its reply as a dict, or the typed error for a worker that
    ran out of memory or time or crashed (the worker is then replaced)."""
    timeout = budget_setting("PARSE_TIMEOUT", integer=False)
    header = {**header, "timeout": timeout}
    deadline = None if timeout is None else time.monotonic() + timeout + GRACE_SECONDS
    for attempt in range(2):
        worker = _checkout(budget)
        # A reused worker that left (idle) just before this request: take a fresh one, once.
        retry = worker.tasks > 0 and attempt == 0
        done = False
        try:
            try:
                worker.send(header, payload)
            except BrokenPipeError:
                if retry:
                    continue
                raise _crashed(label, budget, "the worker did not start") from None
            reply, grown, timed_out = worker.receive(deadline)
            if reply is None:
                status = worker.stop()
                # A reused worker that ended without a reply may have died before this request
                # reached it (it was leaving, or was killed while idle, and a busy machine had
                # not yet shown it as gone): a fresh worker tries once more, and its own end is
                # the answer.
                if retry and not timed_out:
                    continue
                if timed_out or status == -getattr(signal, "SIGXCPU", 24):
                    raise _timeout_error(label, timeout)
                raise _crashed(label, budget, f"signal {-status}" if status else "no result")
            message = _decode(reply, label, budget)
            if message.get("memory") or "crash" in message:
                worker.stop()
            else:
                _checkin(worker, grown)
            done = True
            return _outcome(message, label, budget)
        finally:
            if not done:
                worker.stop()  # an interrupted or failed exchange: never reuse it
    raise AssertionError("unreachable")  # pragma: no cover


def _timeout_error(label: str, timeout: float | None) -> DocumentTooLarge:
    return DocumentTooLarge(
        f"{label}: reading its text took more than PARSE_TIMEOUT ({timeout} s), so it was "
        "stopped. Split the file, or raise DJANGO_RAG['PARSE_TIMEOUT'] (seconds).",
        filename=label,
        setting="PARSE_TIMEOUT",
        limit=timeout,
    )


def _crashed(label: str, budget: int, how: str) -> CorruptFile:
    return CorruptFile(
        f"{label}: the parser stopped without a result ({how}). The file is damaged, or "
        f"needed more memory than MAX_PARSE_MEMORY ({budget:,} bytes) allows.",
        filename=label,
    )


def _decode(reply: bytes, label: str, budget: int) -> dict:
    try:
        message = json.loads(reply)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise _crashed(label, budget, "an unreadable result")
    return message


def _outcome(message: dict, label: str, budget: int) -> dict:
    if "crash" in message:
        raise _crashed(label, budget, message["crash"])
    if message.get("memory"):
        raise DocumentTooLarge(
            f"{label}: reading it needed more than MAX_PARSE_MEMORY ({budget:,} bytes) of "
            "memory, so it was stopped. The file may be hostile; if it is not, raise "
            "DJANGO_RAG['MAX_PARSE_MEMORY'].",
            filename=label,
            setting="MAX_PARSE_MEMORY",
            limit=budget,
        )
    if "error" in message:
        raise _rebuild(message)
    if "oserror" in message:
        number, text, filename = message["oserror"]
        raise OSError(number, text, filename)
    return message


def _document(message: dict) -> ParsedDocument:
    return ParsedDocument(
        text=message["text"],
        format=message["format"],
        content_type=message["content_type"],
        title=message["title"],
        pages=[Page(*page) for page in message["pages"]],
        metadata=message["metadata"],
    )


def _rebuild(message: dict) -> RagError:
    """The worker's typed error, as its class (a RagError subclass) with message and details."""
    module, name = message["error"]
    # Only a class this process has loaded (the parser's module was loaded before the request):
    # the worker's message never makes this process import anything.
    cls = getattr(sys.modules.get(module), name, RagError)
    if not (isinstance(cls, type) and issubclass(cls, RagError)):
        cls = RagError
    error = cls.__new__(cls)
    Exception.__init__(error, message["message"])
    error.message = message["message"]
    error.details = message.get("details") or {}
    return error


def _reap(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
            return 0


# --- pipes -------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int, deadline: float | None) -> tuple[bytes | None, bool]:
    """``size`` bytes from ``fd``; (None, False) at end of file first, (None, True) once
    ``deadline`` (monotonic seconds; None: none) passes. ``poll``, not ``select``: a busy
    server's descriptor numbers can pass select's 1,024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks, got = [], 0
    while got < size:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        if not poller.poll(wait):
            return None, True
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            return None, False
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), False


# --- the worker --------------------------------------------------------------------------------


def _serve(requests: int, replies: int, budget: int) -> None:
    """The worker's loop: one request at a time until the parent closes the pipe, or none
    comes for ``_WORKER_EXIT_SECONDS``."""
    _detach_connections()
    _reset_signals()
    _tune_allocator()
    memory.start_worker(budget)
    poller = select.poll()
    poller.register(requests, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        if not poller.poll(_WORKER_EXIT_SECONDS * 1000):
            return
        lengths, _ = _read_exact(requests, _HEADER, None)
        if lengths is None:
            return
        head, _ = _read_exact(requests, int.from_bytes(lengths[:8], "big"), None)
        size = int.from_bytes(lengths[8:], "big")
        payload, _ = _read_exact(requests, size, None) if size else (b"", False)
        if head is None or payload is None:
            return
        header = json.loads(head)
        _limit_cpu(header.get("timeout"))
        message = _handle(header, payload)
        del payload
        try:
            reply = json.dumps(message, default=str).encode()
        except MemoryError:
            reply = b'{"memory": true}'
        del message
        _trim()
        lengths = len(reply).to_bytes(8, "big") + memory.grown().to_bytes(8, "big")
        try:
            _write_all(replies, lengths + reply)
        except OSError:  # the parent is gone
            return


def _handle(header: dict, payload: bytes) -> dict:
    """Run one request; the result or what went wrong, as a JSON-able dict."""
    try:
        op = header["op"]
        if op == "html":
            from .parsers.html import html_to_markdown

            html = payload.decode("utf-8", "surrogatepass")
            del payload
            return {"markdown": html_to_markdown(html, main_content=header["main_content"])}
        if op == "file":
            if header.get("cwd"):
                os.chdir(header["cwd"])
            parsed = parse_file(header["path"], options=header.get("options"))
        else:
            parsed = parse_bytes(
                payload, filename=header["filename"], options=header.get("options")
            )
        del payload
        return {
            "text": parsed.text,
            "format": parsed.format,
            "content_type": parsed.content_type,
            "title": parsed.title,
            "pages": [[page.number, page.start, page.end] for page in parsed.pages],
            "metadata": parsed.metadata,
        }
    except MemoryError:
        return {"memory": True}
    except RagError as exc:
        return {"memory": True} if memory.out_of_memory(exc) else _error(exc)
    except OSError as exc:
        if memory.out_of_memory(exc):
            return {"memory": True}
        return {"oserror": [exc.errno, exc.strerror or str(exc), exc.filename]}
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        if memory.out_of_memory(exc):
            return {"memory": True}
        return {"crash": f"{type(exc).__name__}: {_first_line(exc)}"}


def _first_line(exc: BaseException) -> str:
    """An exception's first line, without file paths (a library's message may quote its own
    source or site-packages path; those say nothing to whoever ingested the file)."""
    from ..utils import scrub_paths

    lines = str(exc).strip().splitlines()
    return scrub_paths(lines[0] if lines else "")[:300]


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


def _detach_connections() -> None:
    try:
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            # The parent's sockets: keep them referenced (never closed from here) and let the
            # worker open its own should a parser use the database.
            _INHERITED.append(connection.connection)
            connection.connection = None
    except Exception:
        pass


def _reset_signals() -> None:
    """A server's handlers (graceful shutdown, reloads) must not run in a worker; Ctrl-C in a
    terminal reaches the whole process group, and the parent, not the worker, answers it (the
    worker then sees its pipe close)."""
    for name in ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM", "SIGQUIT"):
        number = getattr(signal, name, None)
        if number is not None:
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (OSError, ValueError):
        pass


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None)


def _tune_allocator() -> None:
    """Two malloc arenas at most (glibc reserves 64 MiB of address space for each thread's
    arena otherwise: a native library's thread pool would spend the budget on reservations);
    no core file when a limit kills the worker."""
    import resource

    try:
        _libc().mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (OSError, ValueError):
        pass


def _trim() -> None:
    """Give freed memory back to the system, so the next parse has the budget."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _limit_cpu(timeout: float | None) -> None:
    """CPU seconds this request may use: past ``PARSE_TIMEOUT`` and the parent's grace, the
    kernel stops the worker even when no parent is left to."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if timeout is None:
        limit = hard
    else:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime
        limit = math.ceil(used + timeout + 2 * GRACE_SECONDS + 5)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    except (OSError, ValueError):
        pass

"""Terminal feedback for management commands: a dependency-free progress bar, the
"loading model ..." line, and the base class of the ``rag_*`` commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from django_rag.signals import operation_started

#: --threshold of rag_search and rag_ask: what a score means in each mode (docs/search.md).
THRESHOLD_HELP = (
    "drop results scoring below this (default: none): cosine similarity 0-1 in semantic mode, "
    "BM25 (unbounded) in fulltext mode, the fused score 0-1 in hybrid mode"
)


def note(stream, text: str, *, ending: str | None = None) -> None:
    """Write progress or a status line to ``stream`` (a command's ``self.stderr``) in plain
    text: Django styles everything written to ``stderr`` as an error (bold red on a
    terminal), and this is no error. On stderr all the same, so stdout stays the output."""
    if isinstance(stream, OutputWrapper):
        stream.write(text, style_func=_plain, ending=ending)
    else:
        stream.write(text + ("\n" if ending is None else ending))


def _plain(text: str) -> str:
    return text


class ProgressBar:
    """Draws ``[#####-----] 5/10 label`` on a terminal; prints nothing when not a TTY."""

    def __init__(self, total: int, stream, *, width: int = 30, enabled: bool = True):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.width = width
        isatty = getattr(getattr(stream, "_out", stream), "isatty", lambda: False)
        self.enabled = enabled and isatty()

    def advance(self, label: str = "") -> None:
        self.done += 1
        self._draw(label)

    def __call__(self, done: int, total: int, label: str = "") -> None:
        """Use the bar as a ``progress(done, total)`` callback of a service function."""
        self.done, self.total = done, max(total, 1)
        self._draw(label)

    def _draw(self, label: str = "") -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        note(self.stream, f"\r[{bar}] {self.done}/{self.total} {label[:40]:<40}", ending="")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            note(self.stream, "")


@contextmanager
def announce_model_loads(stream: Callable[[], Any], *, enabled: bool = True) -> Iterator[None]:
    """Write ``loading model NAME ...`` to ``stream()`` when a model starts loading inside the
    block (one line per model and process, in place of Hugging Face's progress bars).

    ``stream``: a callable returning the stream (a command's ``self.stderr`` exists only once
    ``execute`` runs). Nothing is written when ``enabled`` is False (``-v 0``).
    """
    if not enabled:
        yield
        return

    def receiver(sender, *, event, metadata, **kwargs):
        if event == "model.load":
            out = stream()
            note(out, f"loading model {metadata.get('model') or '?'} ...")
            out.flush()

    operation_started.connect(receiver, weak=False)
    try:
        yield
    finally:
        operation_started.disconnect(receiver)


NOT_MIGRATED = "The django_rag tables do not exist yet: run python manage.py migrate"

# SQLSTATE of "relation ... does not exist" (psycopg's UndefinedTable), and of "type ... does
# not exist" (UndefinedObject: pgvector's type before the first migration creates it).
_UNDEFINED_TABLE = "42P01"
_UNDEFINED_OBJECT = "42704"


def not_migrated(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says a django_rag table, or the
    ``vector`` type the first migration creates, is missing: the database was never migrated.
    A missing table of the project's own (a model ``rag_sync`` indexes) is not ours to explain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if code == _UNDEFINED_TABLE and 'relation "django_rag_' in str(current):
            return True
        if code == _UNDEFINED_OBJECT and '"vector"' in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


class RagCommand(BaseCommand):
    """Base of the ``rag_*`` commands: a model loaded while the command runs is announced on
    stderr with one line (at verbosity 1 and above); stdout keeps only the command's output, so
    ``--json`` stays parseable. Run before ``migrate``, a command says to run it (a
    :class:`CommandError`) instead of showing a database traceback."""

    def execute(self, *args, **options):
        with announce_model_loads(lambda: self.stderr, enabled=options.get("verbosity", 1) > 0):
            try:
                return super().execute(*args, **options)
            except Exception as exc:
                # Services may wrap the database error in a typed one: look down the chain.
                if isinstance(exc, CommandError) or not not_migrated(exc):
                    raise
                raise CommandError(NOT_MIGRATED) from exc

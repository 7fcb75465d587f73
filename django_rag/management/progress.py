"""Terminal feedback for management commands: a dependency-free progress bar, the
"loading model ..." line, and the base class of the ``rag_*`` commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand

from django_rag.signals import operation_started


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
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label[:40]:<40}", ending="")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("")


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
            out.write(f"loading model {metadata.get('model') or '?'} ...\n")
            out.flush()

    operation_started.connect(receiver, weak=False)
    try:
        yield
    finally:
        operation_started.disconnect(receiver)


class RagCommand(BaseCommand):
    """Base of the ``rag_*`` commands: a model loaded while the command runs is announced on
    stderr with one line (at verbosity 1 and above); stdout keeps only the command's output, so
    ``--json`` stays parseable."""

    def execute(self, *args, **options):
        with announce_model_loads(lambda: self.stderr, enabled=options.get("verbosity", 1) > 0):
            return super().execute(*args, **options)

"""Telemetry: Django signals sent around every django_rag operation.

Three signals carry every event; receivers tell events apart by the ``event`` argument
(``"ingest"``, ``"search"``, ``"llm.complete"``, ``"agent.gate"``, ...)::

    from django.dispatch import receiver
    from django_rag.signals import operation_finished

    @receiver(operation_finished)
    def log_slow(sender, *, event, duration, metadata, **kwargs):
        if duration > 1.0:
            print(event, duration, metadata)

- ``operation_started(event, metadata, system_time, span_id, parent_id)``
- ``operation_finished(event, metadata, duration, span_id, parent_id)``: ``metadata`` holds the
  start metadata plus what the operation reported when it finished; ``duration`` is in seconds.
- ``operation_failed(event, metadata, duration, exception, span_id, parent_id)``

``span_id`` pairs a start with its end; ``parent_id`` is the span of the enclosing operation
(the ``search`` inside an ``ask``), or None.

The sender is always ``None``. A receiver that raises never breaks the operation: the error is
logged on the ``django_rag.signals`` logger. Raw document, query and answer text is left out of
the metadata unless ``DJANGO_RAG["TELEMETRY"]["INCLUDE_TEXT"]`` is True.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.dispatch import Signal

operation_started = Signal()
operation_finished = Signal()
operation_failed = Signal()

logger = logging.getLogger(__name__)

# Metadata keys that carry user text; dropped unless TELEMETRY["INCLUDE_TEXT"] is set.
TEXT_KEYS = frozenset(
    {
        "text",
        "query",
        "question",
        "answer",
        "prompt",
        "rewritten_query",
        "expanded_query",
        "sub_questions",
        "follow_up_query",
        # Arcana's stop metadata carries the ingested document, the search results and the
        # answer; ours carry ids and counts, and these summaries only with INCLUDE_TEXT.
        "document",
        "results",
    }
)


_ids = itertools.count(1)
_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "django_rag_span", default=None
)


class Span:
    """The handle :func:`span` yields: ``set()`` adds metadata to the finished/failed event."""

    __slots__ = ("event", "metadata", "span_id", "parent_id", "parent")

    def __init__(self, event: str, metadata: dict[str, Any]):
        self.event = event
        self.metadata = metadata
        self.span_id = next(_ids)
        parent = _current.get()
        self.parent_id = parent.span_id if parent is not None else None
        self.parent = parent

    def set(self, **metadata: Any) -> None:
        self.metadata.update(metadata)


def _include_text() -> bool:
    from .conf import get_setting

    try:
        return bool(get_setting("TELEMETRY").get("INCLUDE_TEXT"))
    except Exception:  # telemetry must never be the reason an operation fails
        return False


def _public(metadata: dict[str, Any]) -> dict[str, Any]:
    if _include_text():
        return dict(metadata)
    return {key: value for key, value in metadata.items() if key not in TEXT_KEYS}


def _has_receivers(signal: Signal) -> bool:
    return signal.has_listeners(None)


def send(signal: Signal, event: str, metadata: dict[str, Any], **kwargs: Any) -> None:
    """Send ``signal`` for ``event``; receiver errors are logged, never raised."""
    if not _has_receivers(signal):
        return
    for receiver, response in signal.send_robust(
        None, event=event, metadata=_public(metadata), **kwargs
    ):
        if isinstance(response, Exception):
            logger.error(
                "django_rag telemetry receiver %r failed on %s: %r",
                receiver,
                event,
                response,
                exc_info=(type(response), response, response.__traceback__),
            )


@contextmanager
def span(event: str, **metadata: Any) -> Iterator[Span]:
    """Wrap an operation: sends started, then finished (or failed, re-raising the error).

    The yielded :class:`Span` collects stop metadata with ``span.set(key=value)``.
    """
    handle = Span(event, dict(metadata))
    ids = {"span_id": handle.span_id, "parent_id": handle.parent_id}
    send(operation_started, event, metadata, system_time=time.time(), **ids)
    token = _current.set(handle)
    started = time.perf_counter()
    try:
        yield handle
    except GeneratorExit:
        # A streamed operation whose consumer stopped early: it ended, it did not fail.
        handle.set(cancelled=True)
        _finish(token, operation_finished, handle, started, ids)
        raise
    except BaseException as exc:
        _finish(token, operation_failed, handle, started, ids, exception=exc)
        raise
    else:
        _finish(token, operation_finished, handle, started, ids)


def annotate(event: str, **metadata: Any) -> None:
    """Add stop metadata to the innermost open span of ``event`` in this context (nothing when
    none is open): a step deep inside an operation reports to it without being handed its
    span."""
    handle = _current.get()
    while handle is not None and handle.event != event:
        handle = handle.parent
    if handle is not None:
        handle.set(**metadata)


def _finish(token, signal, handle: Span, started: float, ids, **kwargs: Any) -> None:
    duration = time.perf_counter() - started
    try:
        _current.reset(token)
    except ValueError:  # a generator resumed in another context: nothing to restore there
        pass
    send(signal, handle.event, handle.metadata, duration=duration, **ids, **kwargs)


__all__ = [
    "operation_started",
    "operation_finished",
    "operation_failed",
    "span",
    "annotate",
    "Span",
]

"""The telemetry spans of one dashboard request, for the Ask page's timeline.

:func:`capture_spans` connects receivers to the telemetry signals for the duration of a
``with`` block and keeps only the spans sent from the block's own context (a context
variable marks it), so concurrent requests never see each other's spans.
"""

from __future__ import annotations

import contextvars
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..signals import operation_failed, operation_finished, operation_started

_collector: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "django_rag_dashboard_spans", default=None
)
_uids = itertools.count(1)
MAX_SPANS = 500


def _started(sender, *, event, metadata, span_id=None, parent_id=None, **kwargs):
    box = _collector.get()
    if box is None or len(box["spans"]) >= MAX_SPANS:
        return
    span = {
        "event": event,
        "span_id": span_id,
        "parent_id": parent_id,
        "start": time.perf_counter() - box["origin"],
        "duration": None,
        "status": "running",
        "metadata": dict(metadata),
    }
    box["spans"].append(span)
    box["open"][span_id] = span


def _ended(status: str):
    def receiver(sender, *, event, metadata, duration, span_id=None, **kwargs):
        box = _collector.get()
        if box is None:
            return
        span = box["open"].pop(span_id, None)
        if span is None:  # started before the capture, or past MAX_SPANS
            return
        span["duration"] = duration
        span["status"] = status
        span["metadata"] = dict(metadata)
        if status == "failed" and kwargs.get("exception") is not None:
            span["error"] = type(kwargs["exception"]).__name__

    return receiver


_finished = _ended("finished")
_failed = _ended("failed")


@contextmanager
def capture_spans() -> Iterator[list[dict[str, Any]]]:
    """Collect the spans sent inside the block into the yielded list (in start order).

    Each span is a dict: ``event``, ``span_id``, ``parent_id``, ``start`` (seconds from the
    block's start), ``duration`` (None while running), ``status`` (finished, failed,
    running), ``metadata`` and, for a failed one, ``error`` (the exception's type).
    """
    spans: list[dict[str, Any]] = []
    token = _collector.set({"spans": spans, "open": {}, "origin": time.perf_counter()})
    uid = f"django_rag_dashboard_trace_{next(_uids)}"
    pairs = ((operation_started, _started), (operation_finished, _finished))
    pairs += ((operation_failed, _failed),)
    for signal, receiver in pairs:
        signal.connect(receiver, dispatch_uid=uid, weak=False)
    try:
        yield spans
    finally:
        for signal, _receiver in pairs:
            signal.disconnect(dispatch_uid=uid)
        _collector.reset(token)


def timeline(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The spans laid out for display: depth from the parent links, and each bar's offset
    and width as percentages of the whole request."""
    if not spans:
        return {"total": 0.0, "rows": []}
    ends = [s["start"] + (s["duration"] or 0.0) for s in spans]
    total = max(max(ends), 1e-9)
    depth: dict[Any, int] = {}
    rows = []
    for s in spans:
        level = depth.get(s["parent_id"], -1) + 1 if s["parent_id"] in depth else 0
        depth[s["span_id"]] = level
        duration = s["duration"] or 0.0
        rows.append(
            {
                **s,
                "depth": level,
                "indent": min(level, 8) * 12,
                "left": round(100 * s["start"] / total, 2),
                "width": max(round(100 * duration / total, 2), 0.3),
                "ms": round(duration * 1000, 1),
                "details": _details(s["metadata"]),
            }
        )
    return {"total": total, "total_ms": round(total * 1000, 1), "rows": rows}


def _details(metadata: dict[str, Any]) -> str:
    parts = []
    for key, value in metadata.items():
        if isinstance(value, list | tuple):
            value = ", ".join(str(v) for v in value[:10])
        text = str(value)
        parts.append(f"{key}={text[:80]}")
    return "; ".join(parts)[:400]

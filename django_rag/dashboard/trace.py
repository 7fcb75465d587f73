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

from ..results import SearchResult
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


# --- the work of each pipeline step, from what the step declares it produces -------------------

#: The most items of one output shown, and the longest text of one item (LLM text is hostile).
MAX_ITEMS = 50
MAX_ITEM_CHARS = 500


def step_trace(spec: Any, ctx: Any, flags: list[str]) -> dict[str, Any]:
    """One step's row of the Ask page's trace: its name, label, the flags it ran with and
    each output it declares (``StepSpec.outputs``) read from the context just after it ran,
    as ``{"label", "text", "items"}`` (a string, or a list of strings). Outputs with no value
    are left out; ``skipped`` is True when the gate had turned retrieval off."""
    outputs = []
    for output in spec.outputs:
        value = getattr(ctx, output.field, None)
        if _empty(value):
            continue
        shown = output.show(value) if output.show is not None else value
        shown = _display(shown)
        if isinstance(shown, list):
            outputs.append({"label": output.label, "text": None, "items": shown})
        else:
            outputs.append({"label": output.label, "text": shown, "items": None})
    skipped = bool(getattr(ctx, "skip_retrieval", False)) and spec.phase in ("query", "search")
    return {
        "name": spec.name,
        "label": spec.label,
        "flags": flags,
        "flag_labels": [label for flag, label in spec.flags if flag in flags],
        "outputs": outputs,
        "skipped": skipped and not outputs and spec.name != "gate",
    }


def _empty(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return value is None
    if isinstance(value, int | float):
        return value == 0
    try:
        return len(value) == 0
    except TypeError:
        return False


def _display(value: Any) -> str | list[str]:
    """A value as text: a list (or dict) item by item, a search result by its label and
    score; every piece cut to a bounded length."""
    if isinstance(value, dict):
        value = [f"{k}: {v}" for k, v in list(value.items())[:MAX_ITEMS]]
    if isinstance(value, list | tuple):
        items = [_item(v) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"… and {len(value) - MAX_ITEMS} more")
        return items
    return _item(value)


def _item(value: Any) -> str:
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, SearchResult):
        score = value.rerank_score if value.rerank_score is not None else value.score
        text = value.label if score is None else f"{value.label} ({score:.2f})"
    else:
        text = str(value)
    return text if len(text) <= MAX_ITEM_CHARS else text[:MAX_ITEM_CHARS] + "…"

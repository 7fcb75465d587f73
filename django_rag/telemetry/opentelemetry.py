"""OpenTelemetry spans from the telemetry signals (``pip install "django-rag[otel]"``).

Each django_rag operation becomes a span named ``django_rag.<event>`` whose attributes are the
operation's metadata; nested operations (the ``search`` inside an ``ask``) become child spans.
Configure the tracer provider and exporter as usual for your project.
"""

from __future__ import annotations

import threading
from typing import Any

from ..conf import scrub_text
from ..exceptions import MissingDependency
from ..signals import operation_failed, operation_finished, operation_started

_spans: dict[int, Any] = {}
_lock = threading.Lock()
_state: dict[str, Any] = {}


def _attributes(metadata: dict[str, Any]) -> dict[str, Any]:
    attributes = {}
    for key, value in metadata.items():
        if isinstance(value, str):
            attributes[f"django_rag.{key}"] = scrub_text(value)
        elif isinstance(value, bool | int | float):
            attributes[f"django_rag.{key}"] = value
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            attributes[f"django_rag.{key}"] = [scrub_text(v) for v in value]
    return attributes


def _started(sender, *, event, metadata, span_id, parent_id, **kwargs) -> None:
    from opentelemetry import trace

    tracer = _state["tracer"]
    with _lock:
        parent = _spans.get(parent_id) if parent_id is not None else None
    context = trace.set_span_in_context(parent) if parent is not None else None
    otel_span = tracer.start_span(
        f"django_rag.{event}", context=context, attributes=_attributes(metadata)
    )
    with _lock:
        _spans[span_id] = otel_span


def _end(span_id: int, metadata: dict[str, Any], exception: BaseException | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    with _lock:
        otel_span = _spans.pop(span_id, None)
    if otel_span is None:
        return
    otel_span.set_attributes(_attributes(metadata))
    if exception is not None:
        # The message and traceback text are scrubbed: exceptions can quote a failing
        # request, URL credentials included.
        import traceback

        otel_span.record_exception(
            exception,
            attributes={
                "exception.message": scrub_text(exception),
                "exception.stacktrace": scrub_text("".join(traceback.format_exception(exception))),
            },
        )
        otel_span.set_status(Status(StatusCode.ERROR, type(exception).__name__))
    otel_span.end()


def _finished(sender, *, metadata, span_id, **kwargs) -> None:
    _end(span_id, metadata)


def _failed(sender, *, metadata, span_id, exception, **kwargs) -> None:
    _end(span_id, metadata, exception)


def attach(tracer_provider: Any = None) -> None:
    """Start emitting spans through ``tracer_provider`` (default: the global provider)."""
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise MissingDependency("opentelemetry-api", "otel", "OpenTelemetry spans") from exc
    from .. import __version__

    _state["tracer"] = trace.get_tracer("django_rag", __version__, tracer_provider=tracer_provider)
    operation_started.connect(_started, weak=False, dispatch_uid="django_rag.otel.start")
    operation_finished.connect(_finished, weak=False, dispatch_uid="django_rag.otel.stop")
    operation_failed.connect(_failed, weak=False, dispatch_uid="django_rag.otel.error")


def detach() -> None:
    operation_started.disconnect(dispatch_uid="django_rag.otel.start")
    operation_finished.disconnect(dispatch_uid="django_rag.otel.stop")
    operation_failed.disconnect(dispatch_uid="django_rag.otel.error")
    with _lock:
        _spans.clear()

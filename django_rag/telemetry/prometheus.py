"""Prometheus metrics from the telemetry signals (``pip install "django-rag[prometheus]"``).

The metrics live in prometheus_client's default registry, which django-prometheus serves: add
``path("", include("django_prometheus.urls"))`` to your URLs and they appear on ``/metrics``.

``/metrics`` has no access control of its own: protect it in the host project (network
policy, proxy rule or authentication). Collection names are labels only when
``DJANGO_RAG["TELEMETRY"]["PROMETHEUS_COLLECTION_LABELS"]`` is True; otherwise the
``collection`` label is ``"all"``, so metrics do not reveal what collections exist.
"""

from __future__ import annotations

from typing import Any

from ..conf import scrub_text
from ..exceptions import MissingDependency
from ..signals import operation_failed, operation_finished

_metrics: dict[str, Any] = {}


def _build() -> dict[str, Any]:
    if _metrics:
        return _metrics
    try:
        from prometheus_client import Counter, Histogram
    except ImportError as exc:
        raise MissingDependency("django-prometheus", "prometheus", "Prometheus metrics") from exc
    _metrics.update(
        duration=Histogram(
            "django_rag_operation_duration_seconds",
            "Duration of django_rag operations (agent steps are agent.<step>).",
            ["operation", "mode"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        ),
        errors=Counter(
            "django_rag_operation_errors", "django_rag operations that raised.", ["operation"]
        ),
        chunks=Counter("django_rag_chunks_ingested", "Chunks written by ingest.", ["collection"]),
        documents=Counter(
            "django_rag_documents_ingested", "Documents written by ingest.", ["collection"]
        ),
        llm_calls=Counter("django_rag_llm_calls", "LLM calls.", ["model"]),
        tokens=Counter("django_rag_llm_tokens", "LLM tokens.", ["model", "direction"]),
        cost=Counter(
            "django_rag_llm_cost_usd", "LLM cost in USD (models litellm prices).", ["model"]
        ),
    )
    return _metrics


ALL_COLLECTIONS = "all"


def _collection_label(metadata: dict[str, Any]) -> str:
    from ..conf import get_setting

    try:
        named = bool(get_setting("TELEMETRY").get("PROMETHEUS_COLLECTION_LABELS"))
    except Exception:  # telemetry never fails an operation
        named = False
    return str(metadata.get("collection") or "") if named else ALL_COLLECTIONS


def _finished(sender, *, event, metadata, duration, **kwargs) -> None:
    metrics = _metrics
    metrics["duration"].labels(event, str(metadata.get("mode") or "")).observe(duration)
    if event == "ingest" and not metadata.get("deduplicated"):
        collection = _collection_label(metadata)
        metrics["documents"].labels(collection).inc()
        metrics["chunks"].labels(collection).inc(metadata.get("chunk_count") or 0)
    elif event == "llm.complete":
        model = scrub_text(metadata.get("model") or "")
        metrics["llm_calls"].labels(model).inc()
        metrics["tokens"].labels(model, "prompt").inc(metadata.get("prompt_tokens") or 0)
        metrics["tokens"].labels(model, "completion").inc(metadata.get("completion_tokens") or 0)
        if isinstance(metadata.get("cost"), int | float):
            metrics["cost"].labels(model).inc(metadata["cost"])


def _failed(sender, *, event, metadata, duration, **kwargs) -> None:
    _metrics["errors"].labels(event).inc()
    _metrics["duration"].labels(event, str(metadata.get("mode") or "")).observe(duration)


def attach() -> None:
    """Register the metrics and start counting (idempotent)."""
    _build()
    operation_finished.connect(_finished, weak=False, dispatch_uid="django_rag.prometheus")
    operation_failed.connect(_failed, weak=False, dispatch_uid="django_rag.prometheus.err")


def detach() -> None:
    operation_finished.disconnect(dispatch_uid="django_rag.prometheus")
    operation_failed.disconnect(dispatch_uid="django_rag.prometheus.err")

"""Ready-made receivers for django_rag's telemetry signals (:mod:`django_rag.signals`).

- :func:`attach` / :func:`detach`: one log line per finished operation.
- :mod:`django_rag.telemetry.prometheus`: metrics for django-prometheus' ``/metrics``.
- :mod:`django_rag.telemetry.opentelemetry`: OpenTelemetry spans.

``DJANGO_RAG["TELEMETRY"]`` turns them on at start-up: ``LOG_LEVEL`` (attach the logging
receiver at that level), ``PROMETHEUS`` (True by default: on when prometheus_client is
installed), ``OPENTELEMETRY`` (off by default).
"""

from __future__ import annotations

from .logging import attach, detach, format_event

__all__ = ["attach", "detach", "format_event", "setup"]


def setup() -> None:
    """Connect the receivers the settings ask for (called once when the app is ready)."""
    import importlib.util

    from ..conf import get_setting

    config = get_setting("TELEMETRY")
    if config.get("LOG_LEVEL"):
        attach(level=config["LOG_LEVEL"])
    if config.get("PROMETHEUS") and importlib.util.find_spec("prometheus_client"):
        from . import prometheus

        prometheus.attach()
    if config.get("OPENTELEMETRY"):
        from . import opentelemetry

        opentelemetry.attach()

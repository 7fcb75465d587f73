"""A receiver that logs one line per finished (or failed) operation."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..conf import scrub_text
from ..signals import operation_failed, operation_finished

DEFAULT_LOGGER = "django_rag.telemetry"


def _plural(count: Any, word: str) -> str:
    many = word[:-1] + "ies" if word.endswith("y") and word[-2:-1] not in "aeiou" else word + "s"
    if not isinstance(count, int):
        return f"? {many}"
    return f"{count} {word if count == 1 else many}"


def _llm(m: dict[str, Any]) -> str:
    tokens = ""
    if m.get("prompt_tokens") or m.get("completion_tokens"):
        tokens = f", {m.get('prompt_tokens', 0)}+{m.get('completion_tokens', 0)} tokens"
    cost = f", ${m['cost']:.6f}" if isinstance(m.get("cost"), int | float) else ""
    return (
        f"[{m.get('model', '?')}] {m.get('response_chars', '?')} chars out, "
        f"{m.get('prompt_chars', '?')} chars in{tokens}{cost}"
    )


# Key figures of each event's stop metadata (unknown events get no details).
DETAILS: dict[str, Callable[[dict[str, Any]], str]] = {
    "ingest": lambda m: (
        _plural(m.get("chunk_count"), "chunk") + (", duplicate" if m.get("deduplicated") else "")
    ),
    "ingest_many": lambda m: (
        f"{_plural(m.get('document_count'), 'document')}, {_plural(m.get('chunk_count'), 'chunk')}"
        + (f", {m['failed']} skipped" if m.get("failed") else "")
    ),
    "sync_folder": lambda m: (
        ("dry run: " if m.get("dry_run") else "")
        + ", ".join(
            f"{m.get(key, 0)} {key}" for key in ("added", "replaced", "unchanged", "deleted")
        )
        + (f", {m['failed']} failed" if m.get("failed") else "")
    ),
    "delete": lambda m: f"document {m.get('document_id')}",
    "embed": lambda m: f"{_plural(m.get('count'), 'text')}, {m.get('dimensions', '?')} dims",
    "search": lambda m: (
        f"{m.get('mode', '?')}, {_plural(m.get('result_count'), 'result')}"
        + (", reranked" if m.get("reranked") else "")
        + (f", degraded: {'; '.join(m['degraded'])}" if m.get("degraded") else "")
    ),
    "vector_store.search": lambda m: _plural(m.get("result_count"), "result"),
    "vector_store.store": lambda m: _plural(m.get("chunk_count"), "chunk"),
    "rerank": lambda m: f"{m.get('kept', '?')}/{m.get('candidates', '?')} kept",
    "ask": lambda m: (
        f"{_plural(m.get('context_count'), 'chunk')}, "
        f"{_plural(m.get('citation_count'), 'citation')}"
    ),
    "llm.complete": _llm,
    "agent.gate": lambda m: "skip retrieval" if m.get("skip_retrieval") else "retrieve",
    "agent.select": lambda m: _plural(m.get("selected_count"), "collection"),
    "agent.decompose": lambda m: _plural(m.get("sub_question_count"), "sub-question"),
    "agent.search": lambda m: (
        f"{_plural(m.get('total_chunks'), 'chunk')}, {_plural(m.get('iterations'), 'retry')}"
    ),
    "agent.reason": lambda m: _plural(m.get("iterations"), "iteration"),
    "agent.rerank": lambda m: f"{m.get('kept', '?')}/{m.get('original', '?')} kept",
    "agent.answer": lambda m: (
        f"{_plural(m.get('context_chunk_count'), 'chunk')}, "
        f"{_plural(m.get('correction_count'), 'correction')}"
    ),
    "agent.loop": lambda m: (
        f"{m.get('stop_reason', '?')} after {_plural(m.get('iterations'), 'turn')}, "
        f"{_plural(m.get('tool_call_count'), 'tool call')}, {_plural(m.get('chunk_count'), 'source')}"
    ),
    "agent.loop.tool": lambda m: (
        f"{m.get('tool', '?')}: "
        + ("error" if m.get("error") else f"{_plural(m.get('new_chunk_count'), 'new source')}")
    ),
    "evaluation.generate": lambda m: (
        f"{_plural(m.get('created'), 'test case')}, {m.get('skipped', '?')} skipped"
    ),
    "evaluation.run": lambda m: (
        f"{_plural(m.get('total'), 'case')}, mrr {m.get('mrr', 0):.3f}, "
        f"ndcg@10 {m.get('ndcg_at_10', 0):.3f}"
    ),
    "graph.extraction": lambda m: (
        f"{_plural(m.get('entity_count'), 'entity')}, "
        f"{_plural(m.get('relationship_count'), 'relationship')}"
    ),
    "graph.ner": lambda m: _plural(m.get("entity_count"), "entity"),
    "graph.build": lambda m: (
        f"{_plural(m.get('chunks'), 'chunk')}, "
        f"{_plural(m.get('entities'), 'entity')}, {_plural(m.get('relationships'), 'relationship')}"
    ),
    "graph.search": lambda m: (
        f"{_plural(m.get('entities_found'), 'entity')} matched, "
        f"{_plural(m.get('result_count'), 'chunk')}"
        + (f" (skipped: {m['skipped']})" if m.get("skipped") else "")
    ),
    "graph.community_detection": lambda m: _plural(m.get("community_count"), "community"),
    "graph.community_summary": lambda m: f"{m.get('summary_length', '?')} chars",
    "graph.global_search": lambda m: (
        f"{_plural(m.get('summaries'), 'summary')}, {_plural(m.get('points'), 'point')}"
    ),
    "reembed": lambda m: f"{_plural(m.get('reembedded'), 'chunk')} with {m.get('model', '?')}",
    "agent.self_correct": lambda m: f"attempt {m.get('attempt', '?')}: {m.get('result', '?')}",
    "agent.ground": lambda m: (
        f"failed: {m['error']}"
        if m.get("error")
        else f"score {m.get('score', 0):.2f}, {m.get('faithful_span_count', 0)} faithful, "
        f"{m.get('hallucinated_span_count', 0)} hallucinated"
    ),
}


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 0.001:
        return f"{seconds * 1000:.0f}ms"
    return "<1ms"


def format_event(event: str, metadata: dict[str, Any], duration: float | None) -> str:
    """The log line for a finished operation: ``search completed in 12ms (hybrid, 5 results)``."""
    details = ""
    formatter = DETAILS.get(event)
    if formatter is not None:
        try:
            details = formatter(metadata)
        except Exception:  # a receiver never raises on odd metadata
            details = "?"
    suffix = f" ({details})" if details else ""
    # Metadata can carry model names and messages; never let a secret reach a log line.
    return scrub_text(f"[django_rag] {event} completed in {format_duration(duration)}{suffix}")


class _Receiver:
    def __init__(self, level: int, logger: logging.Logger):
        self.level = level
        self.logger = logger

    def finished(self, sender, *, event, metadata, duration, **kwargs) -> None:
        if self.logger.isEnabledFor(self.level):
            self.logger.log(self.level, format_event(event, metadata, duration))

    def failed(self, sender, *, event, metadata, duration, exception, **kwargs) -> None:
        self.logger.warning(
            "[django_rag] %s failed after %s: %s: %s",
            event,
            format_duration(duration),
            type(exception).__name__,
            scrub_text(exception)[:200],
        )


_attached: dict[str, _Receiver] = {}


def attach(*, level: int | str = logging.INFO, logger: str = DEFAULT_LOGGER) -> None:
    """Log every finished operation at ``level`` (failures at WARNING) on ``logger``.

    Calling it again replaces the previous receiver of the same logger.
    """
    detach(logger=logger)
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"unknown log level {level!r}")
    receiver = _Receiver(level, logging.getLogger(logger))
    operation_finished.connect(receiver.finished, weak=False, dispatch_uid=f"log-ok-{logger}")
    operation_failed.connect(receiver.failed, weak=False, dispatch_uid=f"log-err-{logger}")
    _attached[logger] = receiver


def detach(*, logger: str = DEFAULT_LOGGER) -> None:
    """Stop logging on ``logger`` (no error when nothing is attached)."""
    if _attached.pop(logger, None) is not None:
        operation_finished.disconnect(dispatch_uid=f"log-ok-{logger}")
        operation_failed.disconnect(dispatch_uid=f"log-err-{logger}")

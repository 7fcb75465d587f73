"""What every agent step shares: the :func:`step` decorator (the deadline, a failure recorded on
the context instead of raised, telemetry, LLM usage), the fallback note, and the check that an
LLM's query can be searched.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from ..conf import get_setting, scrub_text
from ..exceptions import InvalidInput
from ..llm import collect_usage, deadline
from ..llm.errors import AgentTimeout
from ..validation import clean_query
from .context import Context

# The name the step runner has always logged under (the steps were one module).
logger = logging.getLogger("django_rag.agent.steps")


def step(name: str) -> Callable:
    def decorator(func: Callable[..., None]) -> Callable[..., Context]:
        @functools.wraps(func)
        def run(ctx: Context, **options: Any) -> Context:
            if ctx.error is not None:
                return ctx
            if ctx.deadline_at is not None and time.monotonic() >= ctx.deadline_at:
                ctx.error = AgentTimeout(
                    f"The agent run passed its deadline ({ctx.deadline:g}s) before the {name} "
                    "step, which did not run (nor did the steps after it). Raise "
                    "DJANGO_RAG['AGENT_DEADLINE'] or Agent(deadline=...), or use fewer steps."
                )
                ctx.failed_step = name
                ctx.warnings.append(f"{name}: skipped, the agent's deadline had passed")
                logger.warning("django_rag agent step %s skipped: deadline passed", name)
                return ctx
            # LLM calls inside the step get at most what is left of the run's deadline.
            with collect_usage() as usage, deadline(at=ctx.deadline_at):
                try:
                    func(ctx, **options)
                except Exception as exc:
                    ctx.error = exc
                    ctx.failed_step = name
                    logger.warning(
                        "django_rag agent step %s failed: %s: %s",
                        name,
                        type(exc).__name__,
                        scrub_text(exc)[:500],
                    )
            ctx.usage.add(usage)
            return ctx

        run.step_name = name
        return run

    return decorator


def _fallback(ctx: Context, name: str, exc: Exception, what: str) -> None:
    message = scrub_text(exc)[:500]
    ctx.warnings.append(f"{name}: {message} ({what})")
    logger.info("django_rag agent step %s fell back: %s", name, message)


def _llm(ctx: Context, llm: Any) -> Any:
    return llm if llm is not None else ctx.llm


def _usable(ctx: Context, name: str, query: Any, what: str, instead: str) -> str | None:
    """``query`` (an LLM's rewrite, expansion, sub-question or follow-up) when it can be
    searched, else None with a warning: empty, longer than ``MAX_QUERY_CHARS`` or not valid
    text, it is not used (``instead`` says what is)."""
    if not isinstance(query, str) or not query.strip():
        if query:  # an empty answer is the step's own fallback, not a warning
            ctx.warnings.append(f"{name}: the {what} was not text ({instead})")
        return None
    try:
        cleaned = clean_query(query.strip())
    except InvalidInput as exc:
        if len(query) > get_setting("MAX_QUERY_CHARS"):
            reason = (
                f"{len(query):,} characters, more than MAX_QUERY_CHARS "
                f"({get_setting('MAX_QUERY_CHARS'):,})"
            )
        else:
            reason = scrub_text(exc)[:200]
        ctx.warnings.append(f"{name}: the {what} was unusable: {reason} ({instead})")
        logger.info("django_rag agent step %s: unusable %s: %s", name, what, reason)
        return None
    return cleaned or None

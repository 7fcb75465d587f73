"""The agent's steps as plain functions: each takes a :class:`Context`, updates it, returns it.

Every step:
- returns the context unchanged when an earlier step failed (``ctx.error`` is set);
- takes its own ``llm=`` (else ``ctx.llm``, else ``DJANGO_RAG["LLM"]``), a ``prompt=`` function
  where it prompts an LLM, and a custom component where it has one;
- falls back as documented when its LLM call fails or answers nonsense, noting it in
  ``ctx.warnings``; any other exception marks the step failed (``ctx.error``/``failed_step``);
- sends ``agent.<step>`` telemetry and adds its LLM usage to ``ctx.usage``.

Where they are: :mod:`.query_steps` (gate, rewrite, select, expand, decompose),
:mod:`.search_steps` (search, reason, rerank), :mod:`.answer_steps` (answer, ground,
global_answer), :mod:`.step_base` (the ``step`` decorator they share). :data:`STEPS` names them
all, and every step is importable from here.
"""

from __future__ import annotations

from .answer_steps import answer, global_answer, ground
from .query_steps import MAX_SUB_QUESTIONS, decompose, expand, gate, rewrite, select
from .search_steps import reason, rerank, search
from .step_base import step

STEPS = {
    func.step_name: func
    for func in (
        gate,
        rewrite,
        select,
        expand,
        decompose,
        search,
        reason,
        rerank,
        answer,
        ground,
        global_answer,
    )
}

__all__ = [
    "MAX_SUB_QUESTIONS",
    "STEPS",
    "answer",
    "decompose",
    "expand",
    "gate",
    "global_answer",
    "ground",
    "reason",
    "rerank",
    "rewrite",
    "search",
    "select",
    "step",
]

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
global_answer), :mod:`.step_base` (the ``step`` decorator they share and the registry it
fills). :data:`STEPS` is that registry (name -> :class:`StepSpec`: phase, options, the context
fields the step produces); ``Agent``'s chain methods, the dashboard's Ask page and the
evaluation's agent configurations are built from it. Every step is importable from here.
"""

from __future__ import annotations

# Importing the step modules registers their steps, in this order within each phase.
from .answer_steps import answer, global_answer, ground
from .query_steps import MAX_SUB_QUESTIONS, decompose, expand, gate, rewrite, select
from .search_steps import reason, rerank, search
from .step_base import PHASES, STEPS, Output, StepRegistry, StepSpec, step

__all__ = [
    "MAX_SUB_QUESTIONS",
    "PHASES",
    "STEPS",
    "Output",
    "StepRegistry",
    "StepSpec",
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

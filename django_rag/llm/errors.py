"""Typed failures of LLM calls that are not plain call errors: cut streams and deadlines.

They subclass :class:`~django_rag.exceptions.LLMError`, so code (and the agent's fallbacks)
that handles LLM failures handles them too; match on ``code`` or the class.
"""

from __future__ import annotations

from ..exceptions import LLMError, RagError


class LLMStreamError(LLMError):
    """A streamed answer ended before the model finished it (the connection dropped, or the
    provider never sent its finish event). The text received so far is in ``partial``: it is
    incomplete, so show it as such or ask again."""

    code = "llm_stream_incomplete"

    def __init__(self, message: str, *, model: str = "", partial: str = ""):
        super().__init__(message, model=model)
        self.partial = partial


class LLMTimeout(LLMError, TimeoutError):
    """An LLM answer did not finish within its deadline (``DJANGO_RAG["LLM_DEADLINE"]``, or
    what was left of the agent's ``AGENT_DEADLINE``), retries and streaming included."""

    code = "llm_timeout"

    def __init__(self, message: str, *, model: str = "", attempts: int = 1):
        super().__init__(message, model=model, attempts=attempts)


class AgentTimeout(RagError, TimeoutError):
    """An agent run passed ``AGENT_DEADLINE`` (or ``Agent(deadline=...)``): the steps after it
    did not run. Set as ``ctx.error`` with ``failed_step`` naming the first skipped step."""

    code = "agent_timeout"

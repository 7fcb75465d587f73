"""Typed failures of LLM calls that are not plain call errors: cut streams and deadlines
(defined in :mod:`django_rag.exceptions` with every other typed error)."""

from ..exceptions import AgentTimeout, LLMStreamError, LLMTimeout

__all__ = ["AgentTimeout", "LLMStreamError", "LLMTimeout"]

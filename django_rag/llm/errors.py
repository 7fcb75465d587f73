"""Typed failures of LLM calls that are not plain call errors: refused credentials, cut
streams and deadlines
(defined in :mod:`django_rag.exceptions` with every other typed error)."""

from ..exceptions import AgentTimeout, LLMAuthenticationError, LLMStreamError, LLMTimeout

__all__ = ["AgentTimeout", "LLMAuthenticationError", "LLMStreamError", "LLMTimeout"]

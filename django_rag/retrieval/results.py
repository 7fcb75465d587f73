"""The one result type every search mode returns (defined in :mod:`django_rag.results`)."""

from ..results import SearchResult

__all__ = ["SearchResult"]

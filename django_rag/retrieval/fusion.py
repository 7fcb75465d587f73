"""Fusion (defined in :mod:`django_rag.fusion`, below the stores that use it)."""

from ..fusion import FUSIONS, fuse, rrf_merge

__all__ = ["FUSIONS", "fuse", "rrf_merge"]

"""Entity name normalisation (defined beside the Entity model, which stores its result)."""

from ..models.graph import normalize_name

__all__ = ["normalize_name"]

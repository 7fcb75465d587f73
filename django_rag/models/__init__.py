from .documents import Chunk, Collection, Document
from .managers import ChunkQuerySet

__all__ = ["Chunk", "ChunkQuerySet", "Collection", "Document"]

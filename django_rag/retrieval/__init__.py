from ..results import SearchResult
from .service import search
from .stores import MemoryVectorStore, PgVectorStore, VectorStore, get_vector_store

__all__ = [
    "MemoryVectorStore",
    "PgVectorStore",
    "SearchResult",
    "VectorStore",
    "get_vector_store",
    "search",
]

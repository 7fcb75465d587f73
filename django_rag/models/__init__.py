from .documents import Chunk, Collection, Document
from .fulltext import CorpusStatistic, TermStatistic
from .managers import ChunkQuerySet

__all__ = ["Chunk", "ChunkQuerySet", "Collection", "CorpusStatistic", "Document", "TermStatistic"]

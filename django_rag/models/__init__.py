from .documents import Chunk, Collection, Document
from .evaluation import Relevance, Run, TestCase
from .fulltext import CorpusStatistic, TermStatistic
from .jobs import Job
from .managers import ChunkQuerySet

__all__ = [
    "Chunk",
    "ChunkQuerySet",
    "Collection",
    "CorpusStatistic",
    "Document",
    "Job",
    "Relevance",
    "Run",
    "TermStatistic",
    "TestCase",
]

from .conversations import Conversation, Message
from .documents import Chunk, Collection, Document, SourceVersion
from .evaluation import Relevance, Run, TestCase
from .fulltext import CorpusDelta, CorpusStatistic, TermDelta, TermStatistic
from .graph import Community, Entity, EntityMention, GraphChunk, Relationship
from .jobs import IndexedModelStatus, Job
from .managers import ChunkQuerySet
from .uploads import Upload

__all__ = [
    "Chunk",
    "Community",
    "Entity",
    "EntityMention",
    "GraphChunk",
    "Relationship",
    "ChunkQuerySet",
    "Collection",
    "Conversation",
    "CorpusDelta",
    "CorpusStatistic",
    "Document",
    "SourceVersion",
    "IndexedModelStatus",
    "Job",
    "Message",
    "Relevance",
    "Run",
    "TermDelta",
    "TermStatistic",
    "TestCase",
    "Upload",
]

"""GraphRAG: entities, relationships and communities extracted from the chunks, used by
``search(..., graph=True)``, ``ask(..., graph=True)`` and ``ask(..., global_search=True)``."""

from __future__ import annotations

from ..store.graph_stores import (
    GraphStore,
    MemoryGraphStore,
    PostgresGraphStore,
    get_graph_store,
)
from .builder import build_graph, delete_graph, sweep_orphans
from .communities import (
    CONFIGURED,
    CommunityDetector,
    CommunitySummarizer,
    LeidenDetector,
    communities_to_summarize,
    detect_communities,
    fingerprint,
    summarize_communities,
    summarize_community,
)
from .extractors import (
    CapitalizedEntityExtractor,
    CooccurrenceRelationshipExtractor,
    EntityExtractor,
    ExtractedEntity,
    ExtractedRelationship,
    Extraction,
    GraphExtractor,
    LLMEntityExtractor,
    LLMGraphExtractor,
    LLMRelationshipExtractor,
    NEREntityExtractor,
    RelationshipExtractor,
    get_extractor,
)
from .global_search import global_answer
from .names import normalize_name
from .query import GraphQuery

__all__ = [
    "CONFIGURED",
    "CapitalizedEntityExtractor",
    "CommunityDetector",
    "CommunitySummarizer",
    "CooccurrenceRelationshipExtractor",
    "EntityExtractor",
    "ExtractedEntity",
    "ExtractedRelationship",
    "Extraction",
    "GraphExtractor",
    "GraphQuery",
    "GraphStore",
    "LLMEntityExtractor",
    "LLMGraphExtractor",
    "LLMRelationshipExtractor",
    "LeidenDetector",
    "MemoryGraphStore",
    "NEREntityExtractor",
    "PostgresGraphStore",
    "RelationshipExtractor",
    "build_graph",
    "delete_graph",
    "communities_to_summarize",
    "detect_communities",
    "fingerprint",
    "get_extractor",
    "get_graph_store",
    "global_answer",
    "normalize_name",
    "summarize_communities",
    "summarize_community",
    "sweep_orphans",
]

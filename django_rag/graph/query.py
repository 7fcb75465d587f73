"""An in-memory graph over networkx, for tests, notebooks and small apps.

Build it from a collection's stored graph (:meth:`GraphQuery.from_collection`) or straight from
texts with any extractor, no database needed (:meth:`GraphQuery.from_texts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..exceptions import MissingDependency
from ..models import Community, Entity, EntityMention, Relationship
from .extractors import GraphExtractor, get_extractor
from .names import normalize_name


def _networkx():
    try:
        import networkx
    except ImportError as exc:
        raise MissingDependency("networkx", "graph", "The in-memory graph") from exc
    return networkx


class GraphQuery:
    """Entities as nodes (keyed by normalised name), relationships as edges, plus which
    chunks mention which entities and the community summaries by level."""

    def __init__(self) -> None:
        self.graph = _networkx().MultiGraph()
        self.mentions: dict[str, set[Any]] = {}
        self.summaries: list[dict[str, Any]] = []

    # --- building ---------------------------------------------------------------------------

    def add_entity(self, name: str, type: str = "other", description: str = "", **data) -> str:
        key = normalize_name(name)
        if key and key not in self.graph:
            self.graph.add_node(key, name=name, type=type, description=description, **data)
        return key

    def add_relationship(self, source: str, target: str, type: str = "RELATED_TO", **data) -> None:
        a, b = self.add_entity(source), self.add_entity(target)
        if a and b and a != b and not self.graph.has_edge(a, b, key=type):
            self.graph.add_edge(a, b, key=type, type=type, **data)

    def add_mention(self, name: str, chunk: Any) -> None:
        key = normalize_name(name)
        if key in self.graph:
            self.mentions.setdefault(key, set()).add(chunk)

    @classmethod
    def from_texts(
        cls, texts: Sequence[str] | dict[Any, str], extractor: GraphExtractor | Any = None
    ) -> GraphQuery:
        """Extract a graph from texts (a list, or a dict of chunk id -> text)."""
        items = texts.items() if isinstance(texts, dict) else enumerate(texts)
        chosen = extractor if isinstance(extractor, GraphExtractor) else get_extractor(extractor)
        graph = cls()
        for chunk, text in items:
            extraction = chosen.extract(text)
            for entity in extraction.entities:
                graph.add_entity(entity.name, entity.type, entity.description)
                graph.add_mention(entity.name, chunk)
            for rel in extraction.relationships:
                graph.add_relationship(rel.source, rel.target, rel.type, strength=rel.strength)
        return graph

    @classmethod
    def from_collection(cls, collection: str) -> GraphQuery:
        """Load a collection's stored entities, relationships, mentions and summaries."""

        graph = cls()
        names = {}
        for entity in Entity.objects.filter(collection__name=collection):
            names[entity.pk] = graph.add_entity(
                entity.name, entity.type, entity.description, id=entity.pk
            )
        for rel in Relationship.objects.filter(source__collection__name=collection):
            graph.graph.add_edge(
                names[rel.source_id], names[rel.target_id], key=rel.type, type=rel.type,
                strength=rel.strength,
            )  # fmt: skip
        for entity_id, chunk_id in EntityMention.objects.filter(
            entity__collection__name=collection
        ).values_list("entity_id", "chunk_id"):
            graph.mentions.setdefault(names[entity_id], set()).add(chunk_id)
        for community in Community.objects.filter(collection__name=collection):
            graph.summaries.append(
                {
                    "level": community.level,
                    "summary": community.summary,
                    "entities": [names[pk] for pk in community.entity_ids if pk in names],
                }
            )
        return graph

    def merge(self, other: GraphQuery) -> GraphQuery:
        """A new graph with both graphs' entities (the first graph's spelling and attributes
        kept for a name both have), relationships, mentions and summaries."""
        merged = GraphQuery()
        for source in (self, other):
            for key, data in source.graph.nodes(data=True):
                if key not in merged.graph:
                    merged.graph.add_node(key, **data)
            for a, b, edge_key, data in source.graph.edges(keys=True, data=True):
                if not merged.graph.has_edge(a, b, key=edge_key):
                    merged.graph.add_edge(a, b, key=edge_key, **data)
            for key, chunks in source.mentions.items():
                merged.mentions.setdefault(key, set()).update(chunks)
            merged.summaries.extend(dict(item) for item in source.summaries)
        return merged

    # --- queries ----------------------------------------------------------------------------

    def find(self, name: str, *, fuzzy: bool = False) -> list[str]:
        """Entities named ``name`` (normalised), or containing it with ``fuzzy=True``."""
        key = normalize_name(name)
        if not fuzzy:
            return [key] if key in self.graph else []
        return sorted(node for node in self.graph if key and key in node)

    def traverse(self, name: str, depth: int = 1) -> dict[str, int]:
        """Entities within ``depth`` hops of ``name`` (excluding it), with their distance."""
        key = normalize_name(name)
        if key not in self.graph:
            return {}
        distances = _networkx().single_source_shortest_path_length(self.graph, key, cutoff=depth)
        distances.pop(key, None)
        return dict(sorted(distances.items(), key=lambda item: (item[1], item[0])))

    def chunks_for(self, names: Iterable[str]) -> set[Any]:
        """Chunks that mention any of the entities."""
        found: set[Any] = set()
        for name in names:
            found |= self.mentions.get(normalize_name(name), set())
        return found

    def summaries_at(self, level: int = 0, *, entity: str | None = None) -> list[str]:
        """Community summaries of a level, optionally only those containing ``entity``."""
        key = normalize_name(entity) if entity else None
        return [
            item["summary"]
            for item in self.summaries
            if item["level"] == level
            and item["summary"]
            and (key is None or key in item["entities"])
        ]

    def entity(self, name: str) -> dict[str, Any] | None:
        key = normalize_name(name)
        return dict(self.graph.nodes[key]) if key in self.graph else None

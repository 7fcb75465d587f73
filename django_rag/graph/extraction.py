"""What extraction produces and the base classes of the extractors: the entities and
relationships found in a chunk, their cleaning and bounds (model output is hostile), and the
three kinds of extractor (:mod:`django_rag.graph.extractors` builds them from settings)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conf import graph_setting
from ..exceptions import InvalidInput
from ..validation import clean_metadata
from .names import normalize_name

logger = logging.getLogger("django_rag.graph.extractors")

ENTITY_TYPES = (
    "person",
    "organization",
    "location",
    "event",
    "concept",
    "technology",
    "product",
    "publication",
    "other",
)
NER_TYPES = {"PER": "person", "ORG": "organization", "LOC": "location", "MISC": "concept"}


@dataclass
class ExtractedEntity:
    name: str
    type: str = "other"
    description: str = ""
    span_start: int | None = None
    span_end: int | None = None
    # Stored on the entity (JSON; keys already stored are kept, new keys are added).
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExtractedRelationship:
    source: str
    target: str
    type: str = "RELATED_TO"
    description: str = ""
    strength: float = 1.0
    # Stored on the relationship (JSON; keys already stored are kept, new keys are added).
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Extraction:
    entities: list[ExtractedEntity] = field(default_factory=list)
    relationships: list[ExtractedRelationship] = field(default_factory=list)


def clean_type(value: Any) -> str:
    text = re.sub(r"[^a-z_]", "", str(value or "").lower())
    return text or "other"


def clean_relationship_type(value: Any) -> str:
    text = re.sub(r"[^A-Z0-9]+", "_", str(value or "").upper()).strip("_")
    return text[:100] or "RELATED_TO"


def clean_strength(value: Any) -> float:
    try:
        return max(1.0, min(10.0, float(value)))
    except (TypeError, ValueError, OverflowError):  # an int past float's range too
        return 1.0


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _clean_text(value: Any, limit: int) -> str:
    """Printable text of at most ``limit`` characters (PostgreSQL refuses NUL)."""
    return _CONTROL.sub("", str(value or "")).strip()[:limit]


def bounded(extraction: Extraction) -> Extraction:
    """An extraction any extractor returned, made safe to store: names and descriptions
    without control characters and of bounded length, and at most
    ``GRAPH["MAX_ENTITIES_PER_CHUNK"]`` entities and ``MAX_RELATIONSHIPS_PER_CHUNK``
    relationships (the first ones)."""
    entities = []
    for entity in extraction.entities:
        entity.name = _clean_text(entity.name, 255)
        entity.description = _clean_text(entity.description, 2000)
        entities.append(entity)
    entities = dedupe_entities(entities)[: int(graph_setting("MAX_ENTITIES_PER_CHUNK"))]
    relationships = []
    for rel in extraction.relationships:
        rel.source = _clean_text(rel.source, 255)
        rel.target = _clean_text(rel.target, 255)
        rel.description = _clean_text(rel.description, 2000)
        relationships.append(rel)
    relationships = valid_relationships(relationships, entities)
    return Extraction(entities, relationships[: int(graph_setting("MAX_RELATIONSHIPS_PER_CHUNK"))])


def dedupe_entities(entities: Sequence[ExtractedEntity]) -> list[ExtractedEntity]:
    """One entity per normalised name (the first spelling wins); blank names dropped."""
    seen: dict[str, ExtractedEntity] = {}
    for entity in entities:
        key = normalize_name(entity.name)
        if key and key not in seen:
            seen[key] = entity
    return list(seen.values())


def valid_relationships(
    relationships: Sequence[ExtractedRelationship], entities: Sequence[ExtractedEntity]
) -> list[ExtractedRelationship]:
    """Keep edges whose two ends are distinct extracted entities (compared normalised)."""
    names = {normalize_name(e.name) for e in entities}
    kept = []
    for rel in relationships:
        source, target = normalize_name(rel.source), normalize_name(rel.target)
        if source in names and target in names and source != target:
            kept.append(rel)
    return kept


# --- base classes --------------------------------------------------------------------------------


class EntityExtractor:
    def extract(self, text: str) -> list[ExtractedEntity]:
        raise NotImplementedError


class RelationshipExtractor:
    def extract(
        self, text: str, entities: Sequence[ExtractedEntity]
    ) -> list[ExtractedRelationship]:
        raise NotImplementedError


class GraphExtractor:
    """Finds entities and relationships in chunk text. :meth:`extract` reads one chunk;
    :meth:`extract_batch` reads several (``batch_size`` at most per call) and by default
    calls :meth:`extract` for each."""

    batch_size = 1

    def extract(self, text: str) -> Extraction:
        raise NotImplementedError

    def extract_batch(self, texts: Sequence[str]) -> list[Extraction]:
        """One extraction per text, in order."""
        return [self.extract(text) for text in texts]


class CallableEntityExtractor(EntityExtractor):
    def __init__(self, func: Callable[[str], Sequence[Any]]):
        self.func = func

    def extract(self, text):
        return [parse_entity(item) for item in self.func(text) or []]


class CallableRelationshipExtractor(RelationshipExtractor):
    def __init__(self, func: Callable[[str, Sequence[ExtractedEntity]], Sequence[Any]]):
        self.func = func

    def extract(self, text, entities):
        return [parse_relationship(item) for item in self.func(text, entities) or []]


class CallableGraphExtractor(GraphExtractor):
    def __init__(self, func: Callable[[str], Any]):
        self.func = func

    def extract(self, text):
        result = self.func(text)
        if isinstance(result, Extraction):
            return result
        entities, relationships = result
        return Extraction(
            [parse_entity(e) for e in entities or []],
            [parse_relationship(r) for r in relationships or []],
        )


def parse_entity(item: Any) -> ExtractedEntity:
    if isinstance(item, ExtractedEntity):
        item.metadata = entity_metadata(item.metadata)
        return item
    if isinstance(item, str):
        return ExtractedEntity(item)
    return ExtractedEntity(
        name=str(item.get("name") or "")[:255],
        type=clean_type(item.get("type")),
        description=str(item.get("description") or ""),
        span_start=item.get("span_start"),
        span_end=item.get("span_end"),
        metadata=entity_metadata(item.get("metadata")),
    )


def entity_metadata(value: Any) -> dict[str, Any]:
    """An extractor's entity or relationship metadata as a JSON object PostgreSQL accepts;
    anything else (an LLM's reply is untrusted) is dropped with a warning rather than failing
    the chunk."""
    if value is None or value == {}:
        return {}
    try:
        return clean_metadata(value)
    except InvalidInput as exc:
        logger.warning("Graph metadata dropped: %s", exc)
        return {}


def parse_relationship(item: Any) -> ExtractedRelationship:
    if isinstance(item, ExtractedRelationship):
        item.metadata = entity_metadata(item.metadata)
        return item
    return ExtractedRelationship(
        source=str(item.get("source") or ""),
        target=str(item.get("target") or ""),
        type=clean_relationship_type(item.get("type")),
        description=str(item.get("description") or ""),
        strength=clean_strength(item.get("strength")),
        metadata=entity_metadata(item.get("metadata")),
    )


# --- LLM extractors -----------------------------------------------------------------------------

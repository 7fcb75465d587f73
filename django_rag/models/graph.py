"""The knowledge graph: entities, their mentions in chunks, relationships and communities."""

from __future__ import annotations

import re
import unicodedata

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models

from .documents import Chunk, Collection
from .fields import EmbeddingField

# Entity name normalisation: the one key used on both sides of every comparison.
_SEPARATORS = re.compile(r"[_\-]+")
_SPACES = re.compile(r"\s+")


def normalize_name(name: str | None) -> str:
    """``"Two_Year-Limited  Warranty"`` -> ``"two year limited warranty"``.

    Unicode NFKC first (so composed and decomposed accents, full-width letters and ligatures
    agree), then case folding, ``_``/``-`` runs to a space, whitespace runs to one space, trim.
    """
    if not name:
        return ""
    text = unicodedata.normalize("NFKC", str(name)).casefold()
    text = _SEPARATORS.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


class Entity(models.Model):
    """A named thing found in a collection's chunks (one row per normalised name)."""

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="entities")
    name = models.CharField(max_length=255)  # the first spelling seen
    normalized_name = models.CharField(max_length=255)
    type = models.CharField(max_length=50, default="other")
    description = models.TextField(blank=True, default="")
    embedding = EmbeddingField(null=True, blank=True)
    # The model that made ``embedding`` ("" when unknown): an entity of another model than the
    # current embedder's is re-embedded by maintenance.embed_entities (and rag_reembed).
    embedding_model = models.CharField(max_length=255, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "entities"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["collection", "normalized_name"], name="django_rag_entity_unique_name"
            )
        ]
        indexes = [models.Index(fields=["collection", "type"], name="django_rag_entity_type_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.type})"


class EntityMention(models.Model):
    entity = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="mentions")
    chunk = models.ForeignKey(Chunk, on_delete=models.CASCADE, related_name="mentions")
    span_start = models.PositiveIntegerField(null=True, blank=True)
    span_end = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["entity", "chunk"], name="django_rag_mention_unique")
        ]

    def __str__(self) -> str:
        return f"{self.entity_id} in chunk {self.chunk_id}"


class Relationship(models.Model):
    """A typed edge between two entities of one collection (unique per source, target, type)."""

    source = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="outgoing")
    target = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="incoming")
    type = models.CharField(max_length=100)
    description = models.TextField(blank=True, default="")
    strength = models.FloatField(default=1.0)
    # How many extractions found this edge (co-occurrence counts, repeated LLM findings).
    count = models.PositiveIntegerField(default=1)
    # What the extractor attached to the edge (JSON; keys stored first are kept, new keys added).
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["source", "target", "type"], name="django_rag_relationship_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_id} -[{self.type}]-> {self.target_id}"


class GraphChunk(models.Model):
    """Marks a chunk whose entities have been extracted (so incremental builds skip it)."""

    chunk = models.OneToOneField(
        Chunk, on_delete=models.CASCADE, primary_key=True, related_name="graph_state"
    )
    built_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"graph of chunk {self.chunk_id}"


class Community(models.Model):
    """A cluster of entities at one level of the Leiden hierarchy, with an LLM summary."""

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="communities")
    level = models.PositiveSmallIntegerField(default=0)
    entity_ids = ArrayField(models.BigIntegerField(), default=list)
    summary = models.TextField(blank=True, default="")
    # Hash of the members and relationships the summary was written from.
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    dirty = models.BooleanField(default=True)
    change_count = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "communities"
        ordering = ["level", "id"]
        indexes = [GinIndex(fields=["entity_ids"], name="django_rag_community_members")]

    def __str__(self) -> str:
        return f"community {self.pk} (level {self.level}, {len(self.entity_ids)} entities)"

"""Writing graph rows: entities, mentions, relationships, processed chunks and communities.

Every graph write of a collection holds that collection's graph lock (advisory, transaction
level) first, so concurrent ingests, sweeps and rebuilds of one collection take turns and
never deadlock on entity or relationship rows. Reads and writes run on the write database
(:func:`~django_rag.models.databases.write_db`), never on a replica.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Greatest

from ..embeddings import get_embedder
from ..models import Community, Entity, EntityMention, GraphChunk, Relationship
from ..models.databases import write_db
from ..models.graph import normalize_name
from .schema import vector_literal

logger = logging.getLogger(__name__)


def lock_collection_graph(collection_id: int) -> None:
    """Serialise graph writers of one collection until the transaction ends."""
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"django_rag:graph:{collection_id}"],
        )


def persist(
    collection_id: int,
    chunk_ids: Sequence[int],
    extractions: Sequence[Any],  # django_rag.graph.extractors.Extraction
    *,
    embedder: Any = None,
) -> dict[str, int]:
    """Store the extractions of these chunks: entities deduplicated by normalised name within
    the collection, mentions unique per (entity, chunk), relationships unique per (source,
    target, type) with repeated findings counted. Run inside a transaction."""
    db = write_db()
    lock_collection_graph(collection_id)
    found = collect_entities(extractions)
    ids = dict(
        Entity.objects.using(db)
        .filter(collection_id=collection_id, normalized_name__in=list(found))
        .values_list("normalized_name", "pk")
    )
    new = [key for key in found if key not in ids]
    if new:
        vectors, model = embed_entities([found[k] for k in new], embedder)
        Entity.objects.using(db).bulk_create(
            [
                Entity(
                    collection_id=collection_id,
                    name=found[key].name[:255],
                    normalized_name=key[:255],
                    type=found[key].type[:50],
                    description=found[key].description,
                    embedding=vector,
                    embedding_model=model if vector is not None else "",
                    metadata=found[key].metadata,
                )
                for key, vector in zip(new, vectors, strict=True)
            ],
            ignore_conflicts=True,
        )
        ids.update(
            Entity.objects.using(db)
            .filter(collection_id=collection_id, normalized_name__in=new)
            .values_list("normalized_name", "pk")
        )
    _add_entity_metadata(
        {ids[k]: found[k].metadata for k in found if k in ids and k not in new}, db
    )
    mentions = []
    edges: dict[tuple[int, int, str], dict[str, Any]] = {}
    for chunk_id, extraction in zip(chunk_ids, extractions, strict=True):
        for entity in extraction.entities:
            key = normalize_name(entity.name)
            if key in ids:
                mentions.append(
                    EntityMention(
                        entity_id=ids[key],
                        chunk_id=chunk_id,
                        span_start=entity.span_start,
                        span_end=entity.span_end,
                    )
                )
        for rel in extraction.relationships:
            source, target = (
                ids.get(normalize_name(rel.source)),
                ids.get(normalize_name(rel.target)),
            )
            if source is None or target is None or source == target:
                continue
            edge = edges.setdefault(
                (source, target, rel.type),
                {
                    "count": 0,
                    "strength": rel.strength,
                    "description": rel.description,
                    "metadata": {},
                },
            )
            edge["count"] += 1
            edge["strength"] = max(edge["strength"], rel.strength)
            edge["description"] = edge["description"] or rel.description
            edge["metadata"] = {**(getattr(rel, "metadata", None) or {}), **edge["metadata"]}
    EntityMention.objects.using(db).bulk_create(mentions, ignore_conflicts=True)
    _upsert_relationships(edges, db)
    GraphChunk.objects.using(db).bulk_create(
        [GraphChunk(chunk_id=chunk_id) for chunk_id in chunk_ids], ignore_conflicts=True
    )
    touched = {pk for key in edges for pk in key[:2]}
    if touched:
        # Communities whose members gained relationships drift from their summary.
        Community.objects.using(db).filter(
            collection_id=collection_id, entity_ids__overlap=list(touched)
        ).update(change_count=F("change_count") + 1)
    return {"entities": len(found), "relationships": len(edges), "mentions": len(mentions)}


def collect_entities(extractions: Sequence[Any]) -> dict[str, Any]:
    """The entities of a batch of extractions, one per normalised name: the first spelling,
    filled in with what later findings add (description, a type other than "other",
    metadata keys)."""
    found: dict[str, Any] = {}
    for extraction in extractions:
        for entity in extraction.entities:
            key = normalize_name(entity.name)
            if not key:
                continue
            known = found.get(key)
            if known is None:
                found[key] = entity
            else:  # keep the first spelling, fill in what it lacked
                known.description = known.description or entity.description
                if known.type == "other":
                    known.type = entity.type
                if entity.metadata:
                    known.metadata = {**entity.metadata, **known.metadata}
    return found


def embed_entities(entities: Sequence[Any], embedder: Any = None) -> tuple[list, str]:
    """Vectors of new entities ("name: description") and the model's name; when embedding
    fails, None for each (they stay usable by name and are embedded later)."""
    texts = [f"{e.name}: {e.description}" if e.description else e.name for e in entities]
    try:
        resolved = get_embedder(embedder)
        return list(resolved.embed_documents(texts)), resolved.model_name
    except Exception as exc:
        logger.warning("Entity embeddings failed (%s); stored without them", exc)
        return [None] * len(entities), ""


def _add_entity_metadata(metadata: dict[int, dict[str, Any]], db: str) -> None:
    """Add the keys entities already stored lack (the values stored first are kept)."""
    rows = {pk: value for pk, value in metadata.items() if value}
    if not rows:
        return
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"UPDATE {Entity._meta.db_table} AS e SET metadata = v.m || e.metadata "
            "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::jsonb[]) AS m) AS v "
            "WHERE e.id = v.id AND NOT (e.metadata @> v.m)",
            [list(rows), [json.dumps(value) for value in rows.values()]],
        )


def _upsert_relationships(edges: dict[tuple[int, int, str], dict[str, Any]], db: str) -> None:
    if not edges:
        return
    relationships = Relationship.objects.using(db)
    existing = {
        (r.source_id, r.target_id, r.type): r
        for r in relationships.filter(
            source_id__in={k[0] for k in edges}, target_id__in={k[1] for k in edges}
        )
    }
    for key, edge in edges.items():
        if key in existing:
            # The collection's graph lock is held: the metadata read above is current.
            relationships.filter(pk=existing[key].pk).update(
                count=F("count") + edge["count"],
                strength=Greatest(F("strength"), edge["strength"]),
                metadata={**edge["metadata"], **existing[key].metadata},
            )
    relationships.bulk_create(
        [
            Relationship(
                source_id=key[0],
                target_id=key[1],
                type=key[2],
                description=edge["description"],
                strength=edge["strength"],
                count=edge["count"],
                metadata=edge["metadata"],
            )
            for key, edge in edges.items()
            if key not in existing
        ],
        ignore_conflicts=True,
    )


def sweep_orphans(collection_id: int) -> int:
    """Delete this collection's entities that no chunk mentions any more (their relationships
    go with them) and mark the communities that lost members dirty. Never touches another
    collection. Returns how many entities were deleted."""
    db = write_db()
    lock_collection_graph(collection_id)
    orphans = (
        Entity.objects.using(db)
        .filter(collection_id=collection_id)
        .exclude(Exists(EntityMention.objects.using(db).filter(entity=OuterRef("pk"))))
    )
    ids = list(orphans.values_list("pk", flat=True))
    if not ids:
        return 0
    Entity.objects.using(db).filter(pk__in=ids).delete()
    gone = set(ids)
    for community in Community.objects.using(db).filter(
        collection_id=collection_id, entity_ids__overlap=ids
    ):
        community.entity_ids = [pk for pk in community.entity_ids if pk not in gone]
        community.dirty = True
        community.save(using=db, update_fields=["entity_ids", "dirty", "updated_at"])
    return len(ids)


def delete_graph(collection_id: int) -> None:
    """Remove a collection's whole graph (entities, mentions, relationships, communities)."""
    db = write_db()
    with transaction.atomic(using=db):
        lock_collection_graph(collection_id)
        Community.objects.using(db).filter(collection_id=collection_id).delete()
        Entity.objects.using(db).filter(collection_id=collection_id).delete()
        GraphChunk.objects.using(db).filter(chunk__collection_id=collection_id).delete()


def replace_communities(collection_id: int, partitions: list[list[list[int]]]) -> int:
    """Replace a collection's communities by these partitions (one per level), keeping the
    summary of every community whose level and members did not change."""
    db = write_db()
    communities = Community.objects.using(db).filter(collection_id=collection_id)
    with transaction.atomic(using=db):
        lock_collection_graph(collection_id)
        old = {(c.level, tuple(sorted(c.entity_ids))): c for c in communities}
        fresh = []
        for level, partition in enumerate(partitions):
            for members in partition:
                previous = old.get((level, tuple(sorted(members))))
                community = Community(
                    collection_id=collection_id, level=level, entity_ids=sorted(members)
                )
                if previous is not None:
                    community.summary = previous.summary
                    community.fingerprint = previous.fingerprint
                    community.dirty = previous.dirty
                    community.change_count = previous.change_count
                fresh.append(community)
        communities.delete()
        Community.objects.using(db).bulk_create(fresh)
    return len(fresh)


def save_summary(community_id: int, summary: str, fingerprint: str) -> None:
    """Store a community's new summary and the fingerprint it was written from."""
    Community.objects.using(write_db()).filter(pk=community_id).update(
        summary=summary, fingerprint=fingerprint, dirty=False, change_count=0
    )


def write_entity_vectors(
    ids: Sequence[int], vectors: Sequence[Sequence[float]], *, model: str
) -> None:
    """Store entity embeddings made by ``model`` (after a model switch, or a backfill)."""

    db = write_db()
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        cursor.execute(
            f"UPDATE {Entity._meta.db_table} AS e SET embedding = v.e::vector, "
            "embedding_model = %s "
            "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::text[]) AS e) AS v "
            "WHERE e.id = v.id",
            [model[:255], list(ids), [vector_literal(v) for v in vectors]],
        )

"""Where a knowledge graph lives: the :class:`GraphStore` interface, the PostgreSQL store (the
default: the graph tables, written under the collection's graph lock) and an in-memory store
(tests, notebooks, small single-process projects).

A store is chosen by ``GRAPH["STORE"]`` (``"postgres"``, ``"memory"``, a dotted path, a class, an
instance or a ``{"BACKEND", "OPTIONS"}`` dict) or per call (``graph_store=`` on
:func:`~django_rag.graph.build_graph`, the community functions, graph search and deletes).

Entities, relationships and communities come back as unsaved-or-saved
:class:`~django_rag.models.Entity`, :class:`~django_rag.models.Relationship` and
:class:`~django_rag.models.Community` instances whatever the store, so every consumer
(detectors, summarizers, fingerprints, prompts) reads one shape. Entity ids are integers in
every store.
"""

from __future__ import annotations

import copy
import math
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import count
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from pgvector.django import CosineDistance

from ..conf import build_component, graph_setting
from ..models import Community, Entity, EntityMention, GraphChunk, Relationship
from ..models.databases import write_db
from ..models.graph import normalize_name
from . import graph as sql


class GraphStore:
    """The operations the graph features need from where the graph is kept.

    Writes: :meth:`persist` (a batch of chunks' extractions: entities deduplicated by
    normalised name per collection, mentions unique per entity and chunk, relationships unique
    per source, target and type with repeated findings counted), :meth:`sweep` (entities no chunk
    mentions any more), :meth:`forget_chunks` (chunks deleted), :meth:`delete` (a collection's
    whole graph), :meth:`replace_communities` and :meth:`save_summary`.

    Reads: :meth:`search` (entities by embedding), :meth:`find` (entities by collection,
    normalised names or ids), :meth:`relationships`, :meth:`traverse` (hops over
    relationships), :meth:`mentions` (which chunks mention which entities),
    :meth:`communities`, :meth:`pending_chunks` and :meth:`counts`.

    ``using`` names the database a read goes to (a replica for searches); a store that is not
    in the database ignores it.
    """

    name = "custom"

    # --- writes -------------------------------------------------------------------------------

    def persist(
        self,
        collection_id: int,
        chunk_ids: Sequence[int],
        extractions: Sequence[Any],
        *,
        embedder: Any = None,
    ) -> dict[str, int]:
        """Store the extractions of these chunks (one per chunk, in order) and mark the chunks
        processed. Returns the counts ``entities``, ``relationships`` and ``mentions`` found."""
        raise NotImplementedError

    def sweep(self, collection_id: int) -> int:
        """Delete the collection's entities no chunk mentions (with their relationships) and
        mark the communities that lost members dirty. Returns how many were deleted."""
        raise NotImplementedError

    def forget_chunks(self, chunk_ids: Sequence[int]) -> None:
        """These chunks were deleted: drop their mentions and processed marks (a sweep of their
        collections follows)."""
        raise NotImplementedError

    def delete(self, collection_id: int) -> None:
        """Remove a collection's whole graph."""
        raise NotImplementedError

    def replace_communities(self, collection_id: int, partitions: list[list[list[int]]]) -> int:
        """Replace the collection's communities by these (one partition per level), keeping
        the summary of a community whose level and members did not change."""
        raise NotImplementedError

    def save_summary(self, community_id: int, summary: str, fingerprint: str) -> None:
        raise NotImplementedError

    # --- reads --------------------------------------------------------------------------------

    def pending_chunks(self, chunks: QuerySet) -> QuerySet:
        """Those of ``chunks`` whose extraction is not stored yet."""
        raise NotImplementedError

    def search(
        self,
        vector: Sequence[float],
        collection_ids: Sequence[int] | None,
        *,
        limit: int,
        threshold: float,
        using: str | None = None,
    ) -> dict[int, float]:
        """Entities whose embedding's cosine similarity to ``vector`` is at least
        ``threshold``, best first (at most ``limit``): ``{entity_id: similarity}``."""
        raise NotImplementedError

    def find(
        self,
        collection_ids: Sequence[int] | None = None,
        *,
        names: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
        using: str | None = None,
    ) -> list[Entity]:
        """Entities of these collections (None: all), only those with these normalised
        ``names`` or ``ids`` when given, in id order."""
        raise NotImplementedError

    def relationships(
        self,
        collection_id: int | None = None,
        *,
        among: Iterable[int] | None = None,
        using: str | None = None,
    ) -> list[Relationship]:
        """A collection's relationships, or those with both ends in ``among``, in id order."""
        raise NotImplementedError

    def traverse(
        self,
        seeds: dict[int, float],
        depth: int,
        decay: float,
        collection_ids: Sequence[int] | None,
        *,
        using: str | None = None,
    ) -> tuple[dict[int, float], dict[int, int]]:
        """Follow relationships (both directions) ``depth`` hops from the seeds: every entity
        reached once, at its first hop, scored its best parent's score times ``decay``.
        Returns ``(scores, hops)``, the seeds included at hop 0."""
        raise NotImplementedError

    def mentions(
        self, entity_ids: Iterable[int], scope: QuerySet | None = None
    ) -> list[tuple[int, int]]:
        """``(chunk_id, entity_id)`` of every mention of these entities, only in the chunks
        of ``scope`` when given (read on ``scope``'s database)."""
        raise NotImplementedError

    def mentioned(
        self, entity_ids: Iterable[int], scope: QuerySet, *, outside: bool = False
    ) -> set[int]:
        """Those of ``entity_ids`` that a chunk of ``scope`` mentions (``outside=True``: that a
        chunk not in ``scope`` mentions)."""
        raise NotImplementedError

    def communities(
        self,
        collection_ids: Sequence[int] | None = None,
        *,
        levels: Sequence[int] | None = None,
        members: Iterable[int] | None = None,
        using: str | None = None,
    ) -> list[Community]:
        """Communities of these collections (None: all) at these levels (None: all), only
        those with a member among ``members`` when given."""
        raise NotImplementedError

    def counts(self, collection_ids: Sequence[int]) -> dict[str, int]:
        """How many ``entities`` and ``relationships`` these collections hold."""
        raise NotImplementedError


def _expand(seeds, depth, decay, neighbours) -> tuple[dict[int, float], dict[int, int]]:
    """Breadth-first expansion shared by the stores; ``neighbours(frontier)`` yields the
    ``(source, target)`` edges touching the frontier."""
    scores = dict(seeds)
    hops = dict.fromkeys(seeds, 0)
    frontier = dict(seeds)
    for hop in range(1, depth + 1):
        if not frontier:
            break
        following: dict[int, float] = {}
        for source, target in neighbours(frontier):
            for parent, child in ((source, target), (target, source)):
                if parent in frontier and child not in scores:
                    following[child] = max(following.get(child, 0.0), frontier[parent] * decay)
        for pk, score in following.items():
            scores[pk] = score
            hops[pk] = hop
        frontier = following
    return scores, hops


class PostgresGraphStore(GraphStore):
    """The graph in the PostgreSQL tables (the default). Writes go to the write database
    under the collection's graph lock; the caller runs :meth:`persist` inside its transaction
    (the document write path does, so a failure leaves neither chunks nor graph)."""

    name = "postgres"

    def persist(self, collection_id, chunk_ids, extractions, *, embedder=None):
        return sql.persist(collection_id, chunk_ids, extractions, embedder=embedder)

    def sweep(self, collection_id):
        return sql.sweep_orphans(collection_id)

    def forget_chunks(self, chunk_ids):
        pass  # mentions and processed marks cascade with the chunk rows

    def delete(self, collection_id):
        sql.delete_graph(collection_id)

    def replace_communities(self, collection_id, partitions):
        return sql.replace_communities(collection_id, partitions)

    def save_summary(self, community_id, summary, fingerprint):
        sql.save_summary(community_id, summary, fingerprint)

    def pending_chunks(self, chunks):
        return chunks.exclude(
            Exists(GraphChunk.objects.using(chunks.db).filter(chunk=OuterRef("pk")))
        )

    def search(self, vector, collection_ids, *, limit, threshold, using=None):
        entities = Entity.objects.using(using).filter(embedding__isnull=False)
        if collection_ids is not None:
            entities = entities.filter(collection_id__in=collection_ids)
        rows = (
            entities.annotate(distance=CosineDistance("embedding", vector))
            .filter(distance__lte=1 - threshold)
            .order_by("distance", "pk")
            .values_list("pk", "distance")[:limit]
        )
        return {pk: 1.0 - distance for pk, distance in rows}

    def find(self, collection_ids=None, *, names=None, ids=None, using=None):
        entities = Entity.objects.using(using or write_db()).defer("embedding")
        if collection_ids is not None:
            entities = entities.filter(collection_id__in=list(collection_ids))
        if names is not None:
            entities = entities.filter(normalized_name__in=list(names))
        if ids is not None:
            entities = entities.filter(pk__in=list(ids))
        return list(entities.order_by("pk"))

    def relationships(self, collection_id=None, *, among=None, using=None):
        edges = Relationship.objects.using(using or write_db())
        if collection_id is not None:
            edges = edges.filter(source__collection_id=collection_id)
        if among is not None:
            among = list(among)
            edges = edges.filter(source_id__in=among, target_id__in=among)
        return list(edges.order_by("pk"))

    def traverse(self, seeds, depth, decay, collection_ids, *, using=None):
        def neighbours(frontier):
            edges = Relationship.objects.using(using).filter(
                Q(source_id__in=list(frontier)) | Q(target_id__in=list(frontier))
            )
            if collection_ids is not None:
                edges = edges.filter(source__collection_id__in=collection_ids)
            return edges.values_list("source_id", "target_id")

        return _expand(seeds, depth, decay, neighbours)

    def mentions(self, entity_ids, scope=None):
        rows = EntityMention.objects.using(scope.db if scope is not None else None).filter(
            entity_id__in=list(entity_ids)
        )
        if scope is not None:
            rows = rows.filter(chunk__in=scope)
        return list(rows.values_list("chunk_id", "entity_id"))

    def mentioned(self, entity_ids, scope, *, outside=False):
        ids = list(entity_ids)
        if not ids:
            return set()
        rows = EntityMention.objects.using(scope.db).filter(entity_id__in=ids)
        rows = rows.exclude(chunk__in=scope) if outside else rows.filter(chunk__in=scope)
        return set(rows.values_list("entity_id", flat=True).distinct())

    def communities(self, collection_ids=None, *, levels=None, members=None, using=None):
        rows = Community.objects.using(using or write_db())
        if collection_ids is not None:
            rows = rows.filter(collection_id__in=list(collection_ids))
        if levels is not None:
            rows = rows.filter(level__in=list(levels))
        if members is not None:
            rows = rows.filter(entity_ids__overlap=list(members))
        return list(rows.order_by("level", "pk"))

    def counts(self, collection_ids):
        db = write_db()
        return {
            "entities": Entity.objects.using(db).filter(collection_id__in=collection_ids).count(),
            "relationships": Relationship.objects.using(db)
            .filter(source__collection_id__in=collection_ids)
            .count(),
        }


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return 0.0
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def _copy(row: Any) -> Any:
    """A copy a caller may change without changing the store (lists copied too)."""
    clone = copy.copy(row)
    for name in ("entity_ids", "metadata"):
        if hasattr(row, name):
            setattr(clone, name, copy.copy(getattr(row, name)))
    return clone


class MemoryGraphStore(GraphStore):
    """The graph in this process's memory: nothing is written to the database, and it is gone
    when the process ends. For tests, notebooks and small single-process projects (a worker in
    another process has its own, empty store). Thread-safe; the same rules as the PostgreSQL
    store (deduplication, counted relationships, metadata merges, sweeps, dirty communities).
    Chunk ids refer to the database's chunks, which stay where documents are stored."""

    name = "memory"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._ids = count(1)
            self._entities: dict[int, Entity] = {}
            self._by_name: dict[tuple[int, str], int] = {}
            self._edges: dict[tuple[int, int, str], Relationship] = {}
            self._mentions: dict[int, set[int]] = defaultdict(set)  # entity -> chunks
            self._processed: dict[int, int] = {}  # chunk -> collection
            self._communities: dict[int, Community] = {}

    def persist(self, collection_id, chunk_ids, extractions, *, embedder=None):
        found = sql.collect_entities(extractions)
        with self._lock:
            new = [k for k in found if (collection_id, k) not in self._by_name]
        # Embedded outside the lock (a model call); persist is not concurrent per collection
        # in practice, and a name two callers both add is stored once below.
        vectors, model = sql.embed_entities([found[k] for k in new], embedder) if new else ([], "")
        with self._lock:
            for key, vector in zip(new, vectors, strict=True):
                if (collection_id, key) in self._by_name:
                    continue
                pk = next(self._ids)
                item = found[key]
                self._entities[pk] = Entity(
                    pk=pk,
                    collection_id=collection_id,
                    name=item.name[:255],
                    normalized_name=key[:255],
                    type=item.type[:50],
                    description=item.description,
                    embedding=list(vector) if vector is not None else None,
                    embedding_model=model if vector is not None else "",
                    metadata=dict(item.metadata),
                )
                self._by_name[(collection_id, key)] = pk
            for key in found:
                if key not in new:
                    stored = self._entities[self._by_name[(collection_id, key)]]
                    stored.metadata = {**found[key].metadata, **stored.metadata}
            mentions = 0
            edges: set[tuple[int, int, str]] = set()
            for chunk_id, extraction in zip(chunk_ids, extractions, strict=True):
                self._processed[chunk_id] = collection_id
                for entity in extraction.entities:
                    pk = self._by_name.get((collection_id, normalize_name(entity.name)))
                    if pk is not None:
                        self._mentions[pk].add(chunk_id)
                        mentions += 1
                for rel in extraction.relationships:
                    source = self._by_name.get((collection_id, normalize_name(rel.source)))
                    target = self._by_name.get((collection_id, normalize_name(rel.target)))
                    if source is None or target is None or source == target:
                        continue
                    self._add_edge(source, target, rel)
                    edges.add((source, target, rel.type))
            touched = {pk for key in edges for pk in key[:2]}
            for community in self._communities.values():
                if community.collection_id == collection_id and touched & set(community.entity_ids):
                    community.change_count += 1
            return {"entities": len(found), "relationships": len(edges), "mentions": mentions}

    def _add_edge(self, source: int, target: int, rel: Any) -> None:
        key = (source, target, rel.type)
        edge = self._edges.get(key)
        metadata = dict(getattr(rel, "metadata", None) or {})
        if edge is None:
            self._edges[key] = Relationship(
                pk=next(self._ids),
                source_id=source,
                target_id=target,
                type=rel.type,
                description=rel.description,
                strength=rel.strength,
                count=1,
                metadata=metadata,
            )
        else:
            edge.count += 1
            edge.strength = max(edge.strength, rel.strength)
            edge.description = edge.description or rel.description
            edge.metadata = {**metadata, **edge.metadata}

    def sweep(self, collection_id):
        with self._lock:
            gone = {
                pk
                for pk, entity in self._entities.items()
                if entity.collection_id == collection_id and not self._mentions.get(pk)
            }
            if not gone:
                return 0
            for pk in gone:
                entity = self._entities.pop(pk)
                self._by_name.pop((collection_id, entity.normalized_name), None)
                self._mentions.pop(pk, None)
            self._edges = {
                key: edge
                for key, edge in self._edges.items()
                if edge.source_id not in gone and edge.target_id not in gone
            }
            for community in self._communities.values():
                if community.collection_id == collection_id and gone & set(community.entity_ids):
                    community.entity_ids = [pk for pk in community.entity_ids if pk not in gone]
                    community.dirty = True
            return len(gone)

    def forget_chunks(self, chunk_ids):
        with self._lock:
            chunk_ids = set(chunk_ids)
            for chunks in self._mentions.values():
                chunks -= chunk_ids
            for chunk_id in chunk_ids:
                self._processed.pop(chunk_id, None)

    def delete(self, collection_id):
        with self._lock:
            for entity in [e for e in self._entities.values() if e.collection_id == collection_id]:
                self._mentions.pop(entity.pk, None)
            self._mentions = defaultdict(
                set, {pk: chunks for pk, chunks in self._mentions.items() if chunks}
            )
            for chunk_id in [c for c, owner in self._processed.items() if owner == collection_id]:
                del self._processed[chunk_id]
            self.sweep(collection_id)
            self._communities = {
                pk: c for pk, c in self._communities.items() if c.collection_id != collection_id
            }

    def replace_communities(self, collection_id, partitions):
        with self._lock:
            old = {
                (c.level, tuple(sorted(c.entity_ids))): c
                for c in self._communities.values()
                if c.collection_id == collection_id
            }
            self._communities = {
                pk: c for pk, c in self._communities.items() if c.collection_id != collection_id
            }
            for level, partition in enumerate(partitions):
                for members in partition:
                    community = Community(
                        pk=next(self._ids),
                        collection_id=collection_id,
                        level=level,
                        entity_ids=sorted(members),
                    )
                    previous = old.get((level, tuple(sorted(members))))
                    if previous is not None:
                        community.summary = previous.summary
                        community.fingerprint = previous.fingerprint
                        community.dirty = previous.dirty
                        community.change_count = previous.change_count
                    self._communities[community.pk] = community
            return sum(len(partition) for partition in partitions)

    def save_summary(self, community_id, summary, fingerprint):
        with self._lock:
            community = self._communities.get(community_id)
            if community is not None:
                community.summary, community.fingerprint = summary, fingerprint
                community.dirty, community.change_count = False, 0

    def pending_chunks(self, chunks):
        with self._lock:
            done = list(self._processed)
        return chunks.exclude(pk__in=done) if done else chunks

    def search(self, vector, collection_ids, *, limit, threshold, using=None):
        wanted = None if collection_ids is None else set(collection_ids)
        with self._lock:
            scored = [
                (_cosine(vector, e.embedding), pk)
                for pk, e in self._entities.items()
                if e.embedding is not None and (wanted is None or e.collection_id in wanted)
            ]
        best = sorted(
            (item for item in scored if item[0] >= threshold), key=lambda x: (-x[0], x[1])
        )
        return {pk: score for score, pk in best[:limit]}

    def find(self, collection_ids=None, *, names=None, ids=None, using=None):
        wanted = None if collection_ids is None else set(collection_ids)
        names = None if names is None else set(names)
        ids = None if ids is None else set(ids)
        with self._lock:
            return [
                _copy(e)
                for pk, e in sorted(self._entities.items())
                if (wanted is None or e.collection_id in wanted)
                and (names is None or e.normalized_name in names)
                and (ids is None or pk in ids)
            ]

    def relationships(self, collection_id=None, *, among=None, using=None):
        among = None if among is None else set(among)
        with self._lock:
            return sorted(
                (
                    _copy(r)
                    for r in self._edges.values()
                    if (
                        collection_id is None
                        or self._entities[r.source_id].collection_id == collection_id
                    )
                    and (among is None or (r.source_id in among and r.target_id in among))
                ),
                key=lambda r: r.pk,
            )

    def traverse(self, seeds, depth, decay, collection_ids, *, using=None):
        wanted = None if collection_ids is None else set(collection_ids)

        def neighbours(frontier):
            with self._lock:
                return [
                    (r.source_id, r.target_id)
                    for r in self._edges.values()
                    if (r.source_id in frontier or r.target_id in frontier)
                    and (wanted is None or self._entities[r.source_id].collection_id in wanted)
                ]

        return _expand(seeds, depth, decay, neighbours)

    def mentions(self, entity_ids, scope=None):
        with self._lock:
            rows = [(c, pk) for pk in set(entity_ids) for c in self._mentions.get(pk, ())]
        if scope is None or not rows:
            return sorted(rows)
        inside = set(scope.filter(pk__in={c for c, _ in rows}).values_list("pk", flat=True))
        return sorted(row for row in rows if row[0] in inside)

    def mentioned(self, entity_ids, scope, *, outside=False):
        rows = self.mentions(entity_ids)
        inside = (
            set(scope.filter(pk__in={c for c, _ in rows}).values_list("pk", flat=True))
            if rows
            else set()
        )
        return {pk for chunk, pk in rows if (chunk in inside) != outside}

    def communities(self, collection_ids=None, *, levels=None, members=None, using=None):
        wanted = None if collection_ids is None else set(collection_ids)
        levels = None if levels is None else set(levels)
        members = None if members is None else set(members)
        with self._lock:
            return sorted(
                (
                    _copy(c)
                    for c in self._communities.values()
                    if (wanted is None or c.collection_id in wanted)
                    and (levels is None or c.level in levels)
                    and (members is None or members & set(c.entity_ids))
                ),
                key=lambda c: (c.level, c.pk),
            )

    def counts(self, collection_ids):
        wanted = set(collection_ids)
        with self._lock:
            entities = {pk for pk, e in self._entities.items() if e.collection_id in wanted}
            return {
                "entities": len(entities),
                "relationships": sum(1 for r in self._edges.values() if r.source_id in entities),
            }


#: The process's shared in-memory store: what ``GRAPH["STORE"] = "memory"`` names, so ingest,
#: search and deletes of one process meet the same graph.
memory_store = MemoryGraphStore()

STORE_ALIASES = {
    "postgres": "django_rag.store.graph_stores.PostgresGraphStore",
    "memory": "django_rag.store.graph_stores.memory_store",
}


def get_graph_store(spec: Any = None) -> GraphStore:
    """The graph store ``spec`` names (None: ``GRAPH["STORE"]``): an alias (``"postgres"``,
    ``"memory"``), a dotted path, a class, an instance or a ``{"BACKEND", "OPTIONS"}`` dict."""
    return build_component(
        graph_setting("STORE") if spec is None else spec,
        setting="GRAPH.STORE",
        base=GraphStore,
        aliases=STORE_ALIASES,
    )


class GraphExtractions(list):
    """A document's chunk extractions (one per chunk) and the graph store they are written
    to (None: ``GRAPH["STORE"]``), as the ingest pipeline hands them to the write path."""

    def __init__(self, extractions: Iterable[Any] = (), store: Any = None):
        super().__init__(extractions)
        self.store = store


def store_of(extractions: Any) -> GraphStore:
    """The store a batch of extractions goes to."""
    return get_graph_store(getattr(extractions, "store", None))

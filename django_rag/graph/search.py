"""Graph retrieval: match entities in the query, expand over relationships, score chunks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from pgvector.django import CosineDistance

from ..conf import graph_setting
from ..embeddings import get_embedder
from ..exceptions import ConfigurationError, InvalidOption
from ..models import Community, Entity, EntityMention, Relationship
from ..results import SearchResult
from ..signals import span
from .extractors import get_extractor
from .names import normalize_name


@dataclass
class GraphMatch:
    """What the graph path found for a query (also the graph context of ``ask``)."""

    entities: dict[int, float] = field(default_factory=dict)  # matched: id -> similarity
    expanded: dict[int, float] = field(default_factory=dict)  # all, with decayed scores
    hops: dict[int, int] = field(default_factory=dict)
    # The chunks the search may return (collection, source and metadata filters): the graph
    # context shows only what these chunks support. None: every chunk.
    scope: QuerySet | None = field(default=None, repr=False)
    # The database the search read (a replica, perhaps): the graph context reads it too.
    database: str | None = None
    # Why the graph list was left out of the search, or "" when it was fused: "weak match"
    # (no entity scored MIN_MATCH_SCORE), "no match", "no chunks", "weight 0".
    skipped: str = ""
    # How to expand later (graph_context) when the gate skipped the expansion.
    depth: int = 0
    collection_ids: list[int] | None = field(default=None, repr=False)

    @property
    def strength(self) -> float:
        """How strongly the query matched the graph: its best matched entity's score."""
        return max(self.entities.values(), default=0.0)


def match_entities(
    query: str,
    vector: list[float] | None,
    collection_ids: list[int] | None,
    *,
    matcher: Any = None,
    threshold: float | None = None,
    limit: int | None = None,
    using: str | None = None,
) -> dict[int, float]:
    """Entities the query is about, with a score in (0, 1], read on the database ``using``
    (None: the routers' choice).

    ``matcher``: ``"embedding"`` (cosine similarity of the query and entity embeddings, at
    least ``threshold``), ``"ner"`` (names the NER/entity extractor finds in the query, matched
    by normalised name), or a function ``(query, collection_ids) -> ids or {id: score}``.
    """
    matcher = graph_setting("ENTITY_MATCHER") if matcher is None else matcher
    threshold = graph_setting("MATCH_THRESHOLD") if threshold is None else threshold
    limit = graph_setting("MATCH_LIMIT") if limit is None else limit
    entities = Entity.objects.using(using)
    if collection_ids is not None:
        entities = entities.filter(collection_id__in=collection_ids)
    if matcher == "embedding":
        if vector is None:
            vector = get_embedder(using=using).embed_query(query)
        rows = (
            entities.filter(embedding__isnull=False)
            .annotate(distance=CosineDistance("embedding", vector))
            .filter(distance__lte=1 - threshold)
            .order_by("distance", "pk")
            .values_list("pk", "distance")[:limit]
        )
        return {pk: 1.0 - distance for pk, distance in rows}
    if matcher == "ner":
        found = get_extractor(None, entity_extractor=graph_setting("ENTITY_EXTRACTOR")).extract(
            query
        )
        names = {normalize_name(e.name) for e in found.entities}
        ids = entities.filter(normalized_name__in=names).values_list("pk", flat=True)[:limit]
        return dict.fromkeys(ids, 1.0)
    if callable(matcher):
        result = matcher(query, collection_ids)
        if isinstance(result, dict):
            return {int(k): float(v) for k, v in result.items()}
        return dict.fromkeys((int(pk) for pk in result), 1.0)
    raise ConfigurationError(
        "GRAPH.ENTITY_MATCHER", matcher, "use 'embedding', 'ner' or a function"
    )


def expand(
    seeds: dict[int, float],
    depth: int,
    decay: float,
    collection_ids: list[int] | None,
    *,
    using: str | None = None,
) -> tuple[dict[int, float], dict[int, int]]:
    """Follow relationships (both directions) ``depth`` hops from the seeds. A neighbour's
    score is its best parent's times ``decay``; each entity appears once, at its first hop."""
    scores = dict(seeds)
    hops = dict.fromkeys(seeds, 0)
    frontier = dict(seeds)
    for hop in range(1, depth + 1):
        if not frontier:
            break
        edges = Relationship.objects.using(using).filter(
            Q(source_id__in=list(frontier)) | Q(target_id__in=list(frontier))
        )
        if collection_ids is not None:
            edges = edges.filter(source__collection_id__in=collection_ids)
        following: dict[int, float] = {}
        for source, target in edges.values_list("source_id", "target_id"):
            for parent, child in ((source, target), (target, source)):
                if parent in frontier and child not in scores:
                    following[child] = max(following.get(child, 0.0), frontier[parent] * decay)
        for pk, score in following.items():
            scores[pk] = score
            hops[pk] = hop
        frontier = following
    return scores, hops


def graph_results(
    query: str,
    vector: list[float] | None,
    chunks: QuerySet,
    collection_ids: list[int] | None,
    *,
    depth: int,
    limit: int,
    matcher: Any = None,
    using: str | None = None,
    min_match_score: float = 0.0,
) -> tuple[list[SearchResult], GraphMatch]:
    """Chunks (within ``chunks``, the request's scope) that mention the query's entities or
    their neighbours, scored by the sum of those entities' scores. Everything is read on the
    database ``using`` (None: the one ``chunks`` reads).

    When no entity matched with a score of at least ``min_match_score`` (the gate), no chunk
    is scored: the results are empty and ``GraphMatch.skipped`` says why."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise InvalidOption(f"graph_depth must be a non-negative integer, got {depth!r}")
    using = using or chunks.db
    with span(
        "graph.search", depth=depth, matcher=str(matcher or graph_setting("ENTITY_MATCHER"))
    ) as s:
        seeds = match_entities(query, vector, collection_ids, matcher=matcher, using=using)
        match = GraphMatch(
            seeds, scope=chunks, database=using, depth=depth, collection_ids=collection_ids
        )
        s.set(entities_found=len(seeds), match_score=match.strength)
        if not seeds or match.strength < min_match_score:
            # Not expanded here: graph_context does it if an answer needs the neighbours.
            match.skipped = "no match" if not seeds else "weak match"
            s.set(expanded_entity_count=0, result_count=0, skipped=match.skipped)
            return [], match
        expanded, hops = expand(
            seeds, depth, graph_setting("DEPTH_DECAY"), collection_ids, using=using
        )
        match.expanded, match.hops = expanded, hops
        s.set(expanded_entity_count=len(expanded))
        totals: dict[int, float] = defaultdict(float)
        for chunk_id, entity_id in (
            EntityMention.objects.using(using)
            .filter(entity_id__in=list(expanded), chunk__in=chunks)
            .values_list("chunk_id", "entity_id")
        ):
            totals[chunk_id] += expanded[entity_id]
        best = sorted(totals, key=lambda pk: (-totals[pk], pk))[:limit]
        rows = {
            chunk.pk: chunk
            for chunk in chunks.filter(pk__in=best).select_related("document", "collection")
        }
        results = []
        for pk in best:
            chunk = rows[pk]
            chunk.score = totals[pk]
            result = SearchResult.from_chunk(chunk)
            result.graph_score = totals[pk]
            results.append(result)
        if not results:
            match.skipped = "no chunks"
            s.set(skipped=match.skipped)
        s.set(result_count=len(results))
    return results, match


def graph_context(match: GraphMatch) -> dict[str, list]:
    """Entities, relationships and community summaries for an answer prompt, confined to
    what the chunks in the search's scope (``match.scope``) support, like the chunks are:

    - entities: the matched ones that a chunk in scope mentions;
    - an entity's description only when every chunk mentioning it is in scope (descriptions
      are merged from all of the collection's mentions, so under a ``source_id`` or
      ``metadata`` filter one could carry text from a document outside it);
    - relationships between in-scope entities, when both ends are wholly in scope or a chunk
      in scope mentions both (relationships do not record the chunk they came from);
    - a community summary only when every member is wholly in scope.

    With only a collection filter (or none) everything in those collections is in scope. All
    of it is read on the database the search read (``match.database``).
    """
    empty: dict[str, list] = {"entities": [], "relationships": [], "summaries": []}
    if not match.entities:
        return empty
    scope = match.scope
    using = match.database or (scope.db if scope is not None else None)
    if not match.expanded:  # the gate left the graph list out of the search: expand now
        match.expanded, match.hops = expand(
            match.entities,
            match.depth,
            graph_setting("DEPTH_DECAY"),
            match.collection_ids,
            using=using,
        )
    mentions = EntityMention.objects.using(using)
    candidates = list(match.expanded or match.entities)
    if scope is None:
        in_scope, outside = set(candidates), set()
    else:
        in_scope = set(
            mentions.filter(entity_id__in=candidates, chunk__in=scope).values_list(
                "entity_id", flat=True
            )
        )
        outside = _mentioned_outside(in_scope, scope)
    matched = [
        pk for pk in sorted(match.entities, key=lambda pk: -match.entities[pk]) if pk in in_scope
    ][: graph_setting("CONTEXT_ENTITIES")]
    entities = Entity.objects.using(using).in_bulk(matched)
    ordered = []
    for pk in matched:
        entity = entities.get(pk)
        if entity is None:
            continue
        if pk in outside:
            entity.description = ""  # known from chunks outside the scope
        ordered.append(entity)
    inside = [pk for pk in candidates if pk in in_scope]
    edges = Relationship.objects.using(using).filter(source_id__in=inside, target_id__in=inside)
    if scope is not None and outside:
        both_mentioned = mentions.filter(
            entity_id=OuterRef("source_id"),
            chunk__in=scope,
            chunk__mentions__entity_id=OuterRef("target_id"),
        )
        edges = edges.filter(
            (~Q(source_id__in=list(outside)) & ~Q(target_id__in=list(outside)))
            | Q(Exists(both_mentioned))
        )
    relationships = list(
        edges.select_related("source", "target").order_by("-strength", "pk")[
            : graph_setting("CONTEXT_RELATIONSHIPS")
        ]
    )
    seeds = set(matched)
    communities = []
    if seeds:
        candidates_c = list(
            Community.objects.using(using)
            .filter(entity_ids__overlap=list(seeds), level__in=graph_setting("SUMMARY_LEVELS"))
            .exclude(summary="")
        )
        if scope is not None and candidates_c:
            members = {pk for c in candidates_c for pk in c.entity_ids}
            mentioned = set(
                mentions.filter(entity_id__in=members, chunk__in=scope).values_list(
                    "entity_id", flat=True
                )
            )
            excluded = (members - mentioned) | _mentioned_outside(members, scope)
            candidates_c = [c for c in candidates_c if not excluded & set(c.entity_ids)]
        communities = candidates_c
    # Most overlap with the matched entities first; then the more specific (smaller) ones.
    communities.sort(key=lambda c: (-len(seeds & set(c.entity_ids)), len(c.entity_ids), c.pk))
    return {
        "entities": ordered,
        "relationships": relationships,
        "summaries": [c.summary for c in communities[: graph_setting("CONTEXT_SUMMARIES")]],
    }


def _mentioned_outside(entity_ids: Iterable[int], scope: QuerySet) -> set[int]:
    """Those of ``entity_ids`` that a chunk outside ``scope`` mentions (read where ``scope``
    is)."""
    ids = list(entity_ids)
    if not ids:
        return set()
    return set(
        EntityMention.objects.using(scope.db)
        .filter(entity_id__in=ids)
        .exclude(chunk__in=scope)
        .values_list("entity_id", flat=True)
        .distinct()
    )

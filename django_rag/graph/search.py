"""Graph retrieval: match entities in the query, expand over relationships, score chunks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from ..conf import graph_setting
from ..embeddings import get_embedder
from ..exceptions import ConfigurationError, InvalidOption
from ..results import SearchResult
from ..signals import span
from ..store.graph_stores import get_graph_store
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
    # The graph store the match read (None: GRAPH["STORE"]); the graph context reads it too.
    store: Any = field(default=None, repr=False)

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
    graph_store: Any = None,
) -> dict[int, float]:
    """Entities the query is about, with a score in (0, 1], read in ``graph_store`` (None:
    ``GRAPH["STORE"]``) on the database ``using`` (None: the routers' choice).

    ``matcher``: ``"embedding"`` (cosine similarity of the query and entity embeddings, at
    least ``threshold``), ``"ner"`` (names the NER/entity extractor finds in the query, matched
    by normalised name), or a function ``(query, collection_ids) -> ids or {id: score}``.
    """
    matcher = graph_setting("ENTITY_MATCHER") if matcher is None else matcher
    threshold = graph_setting("MATCH_THRESHOLD") if threshold is None else threshold
    limit = graph_setting("MATCH_LIMIT") if limit is None else limit
    store = get_graph_store(graph_store)
    if matcher == "embedding":
        if vector is None:
            vector = get_embedder(using=using).embed_query(query)
        return store.search(vector, collection_ids, limit=limit, threshold=threshold, using=using)
    if matcher == "ner":
        found = get_extractor(None, entity_extractor=graph_setting("ENTITY_EXTRACTOR")).extract(
            query
        )
        names = {normalize_name(e.name) for e in found.entities}
        entities = store.find(collection_ids, names=names, using=using)[:limit]
        return dict.fromkeys((e.pk for e in entities), 1.0)
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
    graph_store: Any = None,
) -> tuple[dict[int, float], dict[int, int]]:
    """Follow relationships (both directions) ``depth`` hops from the seeds. A neighbour's
    score is its best parent's times ``decay``; each entity appears once, at its first hop."""
    return get_graph_store(graph_store).traverse(seeds, depth, decay, collection_ids, using=using)


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
    graph_store: Any = None,
) -> tuple[list[SearchResult], GraphMatch]:
    """Chunks (within ``chunks``, the request's scope) that mention the query's entities or
    their neighbours, scored by the sum of those entities' scores. Everything is read on the
    database ``using`` (None: the one ``chunks`` reads).

    When no entity matched with a score of at least ``min_match_score`` (the gate), no chunk
    is scored: the results are empty and ``GraphMatch.skipped`` says why."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise InvalidOption(f"graph_depth must be a non-negative integer, got {depth!r}")
    using = using or chunks.db
    store = get_graph_store(graph_store)
    with span(
        "graph.search", depth=depth, matcher=str(matcher or graph_setting("ENTITY_MATCHER"))
    ) as s:
        seeds = match_entities(
            query, vector, collection_ids, matcher=matcher, using=using, graph_store=store
        )
        match = GraphMatch(
            seeds,
            scope=chunks,
            database=using,
            depth=depth,
            collection_ids=collection_ids,
            store=store,
        )
        s.set(entities_found=len(seeds), match_score=match.strength)
        if not seeds or match.strength < min_match_score:
            # Not expanded here: graph_context does it if an answer needs the neighbours.
            match.skipped = "no match" if not seeds else "weak match"
            s.set(expanded_entity_count=0, result_count=0, skipped=match.skipped)
            return [], match
        expanded, hops = store.traverse(
            seeds, depth, graph_setting("DEPTH_DECAY"), collection_ids, using=using
        )
        match.expanded, match.hops = expanded, hops
        s.set(expanded_entity_count=len(expanded))
        totals: dict[int, float] = defaultdict(float)
        for chunk_id, entity_id in store.mentions(expanded, chunks.using(using)):
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
    store = get_graph_store(match.store)
    if scope is not None:
        scope = scope.using(using)
    if not match.expanded:  # the gate left the graph list out of the search: expand now
        match.expanded, match.hops = store.traverse(
            match.entities,
            match.depth,
            graph_setting("DEPTH_DECAY"),
            match.collection_ids,
            using=using,
        )
    candidates = list(match.expanded or match.entities)
    if scope is None:
        in_scope, outside = set(candidates), set()
    else:
        in_scope = store.mentioned(candidates, scope)
        outside = store.mentioned(in_scope, scope, outside=True)
    matched = [
        pk for pk in sorted(match.entities, key=lambda pk: -match.entities[pk]) if pk in in_scope
    ][: graph_setting("CONTEXT_ENTITIES")]
    inside = [pk for pk in candidates if pk in in_scope]
    names = {e.pk: e for e in store.find(ids=set(inside) | set(matched), using=using)}
    ordered = []
    for pk in matched:
        entity = names.get(pk)
        if entity is None:
            continue
        if pk in outside:
            entity.description = ""  # known from chunks outside the scope
        ordered.append(entity)
    edges = store.relationships(among=inside, using=using)
    if scope is not None and outside:
        # An edge touching an entity also known from outside the scope is shown only when a
        # chunk in scope mentions both its ends (relationships do not record their chunk).
        together: dict[int, set[int]] = defaultdict(set)
        for chunk_id, entity_id in store.mentions(inside, scope):
            together[chunk_id].add(entity_id)
        pairs = {(a, b) for group in together.values() for a in group for b in group}
        edges = [
            r
            for r in edges
            if (r.source_id not in outside and r.target_id not in outside)
            or (r.source_id, r.target_id) in pairs
        ]
    edges.sort(key=lambda r: (-r.strength, r.pk))
    relationships = []
    for rel in edges[: graph_setting("CONTEXT_RELATIONSHIPS")]:
        if rel.source_id in names and rel.target_id in names:
            rel.source, rel.target = names[rel.source_id], names[rel.target_id]
            relationships.append(rel)
    seeds = set(matched)
    communities = []
    if seeds:
        candidates_c = [
            c
            for c in store.communities(
                levels=graph_setting("SUMMARY_LEVELS"), members=seeds, using=using
            )
            if c.summary
        ]
        if scope is not None and candidates_c:
            members = {pk for c in candidates_c for pk in c.entity_ids}
            mentioned = store.mentioned(members, scope)
            excluded = (members - mentioned) | store.mentioned(members, scope, outside=True)
            candidates_c = [c for c in candidates_c if not excluded & set(c.entity_ids)]
        communities = candidates_c
    # Most overlap with the matched entities first; then the more specific (smaller) ones.
    communities.sort(key=lambda c: (-len(seeds & set(c.entity_ids)), len(c.entity_ids), c.pk))
    return {
        "entities": ordered,
        "relationships": relationships,
        "summaries": [c.summary for c in communities[: graph_setting("CONTEXT_SUMMARIES")]],
    }

"""The Ask page's knowledge-graph parts: which collections have a graph (the graph toggle),
and what the graph added to an answer (the graph-context panel, each chunk's "via")."""

from __future__ import annotations

from ...conf import graph_setting
from ...graph.search import expand, match_entities
from ...models import Chunk, Collection, Entity
from ...store.graph_stores import PostgresGraphStore, get_graph_store
from .common import visible_collections


def graph_collections(request) -> list[str]:
    """The names of the collections the user may see that have entities in the graph store
    (one query on the entity table with the PostgreSQL store; another store is asked for
    each collection's counts)."""
    visible = visible_collections(request)
    store = get_graph_store()
    if not isinstance(store, PostgresGraphStore):
        return [c.name for c in visible if store.counts([c.pk])["entities"]]
    return sorted(
        Entity.objects.filter(collection__in=visible)
        .values_list("collection__name", flat=True)
        .order_by("collection__name")
        .distinct()
    )


#: The most entities named as what brought one chunk in ("via").
VIA_ENTITIES = 3


def graph_context(
    chunks: list[dict],
    spans: list[dict],
    given: dict | None,
    *,
    question: str = "",
    scope: list[str] | None = None,
) -> dict | None:
    """What the knowledge graph added: the searches it took part in, its chunks (each with the
    entities that brought it in), and the entities, relationships and summaries given to the
    LLM (``Answer.graph``), else (the pipeline, the loop) those the question matched."""
    searches = [
        s["metadata"] for s in spans if s["event"] == "search" and "graph_enhanced" in s["metadata"]
    ]
    graphed = [row for row in chunks if row["result"].graph_score is not None]
    if not searches and not graphed and not given:
        return None
    reached: dict = {}
    matched: dict = {}
    if graphed or not given:
        try:
            reached, matched = _graph_reach(question, scope)
        except Exception:  # an embedder outage after the answer: the panel goes without via
            pass
    if given:
        entities = list(given.get("entities") or [])
        relationships = list(given.get("relationships") or [])
    else:
        entities, relationships = _matched_graph(matched, reached)
    via = _via(graphed, reached)
    for row in graphed:  # shown in the chunk table, beside the graph score
        row["via"] = via.get(row["result"].chunk_id, [])
    return {
        "given": bool(given),
        "entities": entities,
        "relationships": relationships,
        "summaries": list((given or {}).get("summaries") or []),
        "searches": len(searches),
        "enhanced": sum(1 for m in searches if m.get("graph_enhanced")),
        "match_scores": [m.get("graph_match_score") for m in searches],
        "chunks": graphed,
    }


def _graph_reach(question: str, scope: list[str] | None) -> tuple[dict, dict]:
    """The graph path's match for the question in these collections, as the search makes it
    (the same matcher, depth and decay): the entities reached (matched and their neighbours)
    and those matched, each ``{id: score}``."""
    ids = None
    if scope is not None:
        ids = list(Collection.objects.filter(name__in=scope).values_list("pk", flat=True))
    seeds = match_entities(question, None, ids)
    if not seeds:
        return {}, {}
    reached, _ = expand(seeds, graph_setting("DEPTH"), graph_setting("DEPTH_DECAY"), ids)
    return {**seeds, **reached}, seeds


def _matched_graph(matched: dict, reached: dict) -> tuple[list, list]:
    """The matched entities, best first, and the strongest relationships among those reached
    (as many as an answer's graph context would carry)."""
    store = get_graph_store()
    found = {e.pk: e for e in store.find(ids=set(reached))}
    entities = [found[pk] for pk in sorted(matched, key=lambda pk: -matched[pk]) if pk in found]
    entities = entities[: graph_setting("CONTEXT_ENTITIES")]
    edges = sorted(store.relationships(among=list(reached)), key=lambda r: (-r.strength, r.pk))
    relationships = []
    for rel in edges[: graph_setting("CONTEXT_RELATIONSHIPS")]:
        if rel.source_id in found and rel.target_id in found:
            rel.source, rel.target = found[rel.source_id], found[rel.target_id]
            relationships.append(rel)
    return entities, relationships


def _via(graphed: list[dict], reached: dict) -> dict[int, list]:
    """For each chunk the graph scored, the reached entities it mentions (those that brought
    it in), highest score first, at most :data:`VIA_ENTITIES`."""
    if not graphed or not reached:
        return {}
    store = get_graph_store()
    chunk_ids = [row["result"].chunk_id for row in graphed]
    pairs = store.mentions(reached, Chunk.objects.filter(pk__in=chunk_ids))
    names = {e.pk: e for e in store.find(ids={pk for _, pk in pairs})}
    by_chunk: dict[int, list] = {}
    for chunk_id, pk in pairs:
        if pk in names:
            by_chunk.setdefault(chunk_id, []).append(names[pk])
    return {
        chunk_id: sorted(found, key=lambda e: (-reached[e.pk], e.name))[:VIA_ENTITIES]
        for chunk_id, found in by_chunk.items()
    }

"""Communities: hierarchical Leiden over a collection's graph, and their LLM summaries."""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..conf import graph_setting
from ..exceptions import InvalidOption, LLMError, MissingDependency, UnknownCollection
from ..llm import get_llm, map_concurrently
from ..llm.prompting import quote
from ..models import Collection, Community, Entity, Relationship
from ..models.databases import write_db
from ..signals import span
from ..store.graph import replace_communities, save_summary
from ..validation import clean_collection_name, clean_number, clean_positive_int

logger = logging.getLogger(__name__)


def fingerprint(entities: Sequence[Entity], relationships: Sequence[Relationship]) -> str:
    """SHA-256 of the members and the relationships among them (order independent)."""
    parts = sorted(f"{e.pk}\x1f{e.name}\x1f{e.type}\x1f{e.description}" for e in entities)
    parts.append("\x00")
    parts += sorted(
        f"{r.source_id}\x1f{r.target_id}\x1f{r.type}\x1f{r.description}" for r in relationships
    )
    return hashlib.sha256("\x1e".join(parts).encode("utf-8")).hexdigest()


# Communities are computed from, and written to, the write database: a lagging replica would
# partition or summarise an older graph.


def _collections(collection: str | None) -> list[Collection]:
    collections = Collection.objects.using(write_db())
    if collection is None:
        return list(collections.order_by("pk"))
    found = list(collections.filter(name=clean_collection_name(collection)))
    if not found:
        raise UnknownCollection(collection)
    return found


def leiden_levels(
    edges: Sequence[tuple[int, int, float]],
    *,
    resolution: float,
    levels: int,
    max_cluster_size: int,
    seed: int | None,
) -> list[list[list[int]]]:
    """Partitions of the nodes, one per hierarchy level (identical consecutive levels
    collapsed). ``edges`` must be in a stable order for ``seed`` to reproduce a partition."""
    try:
        import graspologic_native as gn
    except ImportError as exc:
        raise MissingDependency("graspologic-native", "graph", "Community detection") from exc
    if not edges:
        return []
    clusters = gn.hierarchical_leiden(
        [(str(a), str(b), float(w)) for a, b, w in edges],
        resolution=resolution,
        max_cluster_size=max_cluster_size,
        seed=seed,
    )
    by_level: dict[int, dict[int, int]] = defaultdict(dict)
    for item in clusters:
        by_level[item.level][int(item.node)] = item.cluster
    partitions: list[list[list[int]]] = []
    current: dict[int, int] = {}
    for level in sorted(by_level)[:levels]:
        current = {**current, **by_level[level]}  # a node keeps its cluster until refined
        groups: dict[int, list[int]] = defaultdict(list)
        for node in sorted(current):
            groups[current[node]].append(node)
        partition = sorted(groups.values())
        if not partitions or partition != partitions[-1]:
            partitions.append(partition)
    return partitions


def detect_communities(
    collection: str | None = None,
    *,
    resolution: float | None = None,
    levels: int | None = None,
    max_cluster_size: int | None = None,
    min_size: int | None = None,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Detect the communities of each collection's graph and replace the stored ones.

    The new partition is computed before anything is deleted, so a failure keeps the old
    communities. Summaries carry over to a community with the same level and members; when its
    content fingerprint changed it is marked dirty (re-summarised later).
    """
    resolution = graph_setting("RESOLUTION") if resolution is None else resolution
    levels = graph_setting("LEVELS") if levels is None else levels
    max_cluster_size = (
        graph_setting("MAX_CLUSTER_SIZE") if max_cluster_size is None else max_cluster_size
    )
    min_size = graph_setting("MIN_SIZE") if min_size is None else min_size
    seed = graph_setting("SEED") if seed is None else seed

    clean_positive_int("levels", levels)
    clean_number("resolution", resolution, minimum=0, strict_minimum=True)
    clean_positive_int("min_size", min_size)
    clean_positive_int("max_cluster_size", max_cluster_size)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidOption(f"seed must be an integer or None, got {seed!r}")
    if collection is not None:
        clean_collection_name(collection)
    targets = _collections(collection)
    total = 0
    with span("graph.community_detection", collection=collection, detector="leiden") as s:
        for index, target in enumerate(targets, start=1):
            relationships = list(
                Relationship.objects.using(write_db())
                .filter(source__collection=target)
                .order_by("pk")
            )
            weights: dict[tuple[int, int], float] = defaultdict(float)
            for rel in relationships:
                a, b = sorted((rel.source_id, rel.target_id))
                weights[(a, b)] += float(rel.strength or 1.0)
            edges = [(a, b, w) for (a, b), w in sorted(weights.items())]
            partitions = leiden_levels(
                edges,
                resolution=resolution,
                levels=levels,
                max_cluster_size=max_cluster_size,
                seed=seed,
            )
            total += replace_communities(target, partitions, min_size)
            if progress:
                progress(index, len(targets))
        s.set(community_count=total)
    return {"collections": len(targets), "communities": total}


def _members(community: Community) -> tuple[list[Entity], list[Relationship]]:
    db = write_db()
    entities = list(Entity.objects.using(db).filter(pk__in=community.entity_ids).order_by("pk"))
    relationships = list(
        Relationship.objects.using(db)
        .filter(source_id__in=community.entity_ids, target_id__in=community.entity_ids)
        .order_by("pk")
    )
    return entities, relationships


def needs_summary(community: Community, current_fingerprint: str, threshold: int) -> bool:
    """No summary yet, content changed since it was written, marked dirty, or too many
    changes accumulated (``change_count >= threshold``)."""
    return (
        not community.summary
        or community.dirty
        or community.fingerprint != current_fingerprint
        or community.change_count >= threshold
    )


def summary_prompt(entities: Sequence[Entity], relationships: Sequence[Relationship]) -> str:
    degree: dict[int, int] = defaultdict(int)
    for rel in relationships:
        degree[rel.source_id] += 1
        degree[rel.target_id] += 1
    top = sorted(entities, key=lambda e: (-degree[e.pk], e.pk))[:50]
    names = {e.pk: e.name for e in entities}
    entity_lines = "\n".join(
        f"- {quote(e.name)} ({e.type})" + (f": {quote(e.description)}" if e.description else "")
        for e in top
    )
    rel_lines = "\n".join(
        f"- {quote(names[r.source_id])} --[{r.type}]--> {quote(names[r.target_id])}"
        for r in relationships[:100]
        if r.source_id in names and r.target_id in names
    )
    return (
        "Write a factual summary, 2 or 3 sentences, of the group of related entities below: "
        "what they are and how they connect. Start with the main subject itself; do not start "
        "with 'This community', 'This group' or similar. Use only the information given.\n\n"
        f"Entities:\n{entity_lines or 'none'}\n\nRelationships:\n{rel_lines or 'none'}\n\n"
        "Reply with the summary only."
    )


def summarize_communities(
    collection: str | None = None,
    *,
    llm: Any = None,
    force: bool = False,
    levels: Sequence[int] | str | None = None,
    concurrency: int | None = None,
    threshold: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Summarise the communities that need it (see :func:`needs_summary`), ``concurrency`` LLM
    calls at once. ``levels``: a list of levels, ``"all"``, or ``GRAPH["SUMMARY_LEVELS"]``.
    A failed call leaves that community as it was (counted in ``failed``)."""
    model = get_llm(llm, feature="Community summaries")
    levels = graph_setting("SUMMARY_LEVELS") if levels is None else levels
    if levels != "all":
        levels = [levels] if isinstance(levels, int) else list(levels)
        if not levels or any(not isinstance(v, int) or v < 0 for v in levels):
            raise InvalidOption(f"levels must be non-negative integers or 'all', got {levels!r}")
    threshold = graph_setting("SUMMARY_THRESHOLD") if threshold is None else threshold
    concurrency = concurrency or graph_setting("SUMMARY_CONCURRENCY")
    todo = []
    checked = 0
    for target in _collections(collection):
        communities = Community.objects.using(write_db()).filter(collection=target)
        if levels != "all":
            communities = communities.filter(level__in=levels)
        for community in communities:
            checked += 1
            entities, relationships = _members(community)
            current = fingerprint(entities, relationships)
            if force or needs_summary(community, current, threshold):
                todo.append((community, entities, relationships, current))

    def summarize(item) -> str:
        # LLM calls only: threads must not touch the database (their connections would not see
        # this transaction's rows).
        community, entities, relationships, current = item
        with span("graph.community_summary", entity_count=len(entities)) as s:
            try:
                text = model.complete(summary_prompt(entities, relationships)).text.strip()
            except LLMError as exc:
                logger.warning("Community %s not summarised: %s", community.pk, exc)
                text = ""
            s.set(summary_length=len(text))
        return text

    texts = map_concurrently(summarize, todo, concurrency)
    written = 0
    for (community, _, _, current), text in zip(todo, texts, strict=True):
        if text:
            save_summary(community.pk, text, current)
            written += 1
    if progress:
        progress(len(todo), len(todo))
    return {"communities": checked, "summaries": written, "failed": len(todo) - written}

"""Communities: hierarchical Leiden over a collection's graph, and their LLM summaries."""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..conf import build_component, graph_setting, scrub_text
from ..exceptions import InvalidOption, LLMError, MissingDependency, UnknownCollection
from ..llm import get_llm, map_concurrently
from ..llm.prompting import quote
from ..models import Collection, Community, Entity, Relationship
from ..models.databases import write_db
from ..signals import span
from ..store.graph_stores import get_graph_store
from ..validation import (
    clean_collection_name,
    clean_number,
    clean_positive_int,
    rejects_unknown_options,
)

logger = logging.getLogger(__name__)

#: The longest community summary a custom summarizer may store (characters).
MAX_SUMMARY_CHARS = 20_000


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


# --- pluggable detector and summarizer ----------------------------------------------------------

#: The most levels a community detector may return.
MAX_DETECTED_LEVELS = 32


class CommunityDetector:
    """Partitions a collection's graph into communities (``GRAPH["COMMUNITY_DETECTOR"]``, or
    ``detect_communities(detector=...)``).

    Override :meth:`partition`, which gets the collection's entities and relationships
    (:class:`~django_rag.models.Entity` and :class:`~django_rag.models.Relationship` rows, in
    id order, with their type, description, strength, count and metadata) and the options in
    force (``resolution``, ``levels``, ``max_cluster_size``, ``min_size``, ``seed``); or, the
    older form, :meth:`detect`, which gets the entity ids (ascending) and the weighted edges
    ``(entity_id, entity_id, weight)`` (ascending, one per pair, strengths summed).

    Either returns the levels of a hierarchy, coarse to fine, each a list of communities
    (lists of entity ids); a single partition (a list of lists) is one level. It must not use
    the database (the caller holds the rows)."""

    name = "custom"

    def partition(
        self,
        entities: Sequence[Entity],
        relationships: Sequence[Relationship],
        options: dict[str, Any],
    ) -> list[list[list[int]]]:
        return self.detect([e.pk for e in entities], weighted_edges(relationships))

    def detect(
        self, entity_ids: Sequence[int], edges: Sequence[tuple[int, int, float]]
    ) -> list[list[list[int]]]:
        raise NotImplementedError


def weighted_edges(relationships: Sequence[Relationship]) -> list[tuple[int, int, float]]:
    """One undirected edge per pair of entities, weighing the sum of their relationships'
    strengths, in ascending order (a stable order: Leiden's seed reproduces a partition)."""
    weights: dict[tuple[int, int], float] = defaultdict(float)
    for rel in relationships:
        a, b = sorted((rel.source_id, rel.target_id))
        weights[(a, b)] += float(rel.strength or 1.0)
    return [(a, b, w) for (a, b), w in sorted(weights.items())]


class LeidenDetector(CommunityDetector):
    """Hierarchical Leiden (graspologic-native), the default. Options left None take the
    ``GRAPH`` settings; :func:`detect_communities`'s own options win over both."""

    name = "leiden"

    def __init__(
        self,
        *,
        resolution: float | None = None,
        levels: int | None = None,
        max_cluster_size: int | None = None,
        seed: int | None = None,
    ):
        self.resolution = resolution
        self.levels = levels
        self.max_cluster_size = max_cluster_size
        self.seed = seed

    def partition(self, entities, relationships, options):
        return leiden_levels(
            weighted_edges(relationships),
            resolution=options["resolution"],
            levels=options["levels"],
            max_cluster_size=options["max_cluster_size"],
            seed=options["seed"],
        )

    def detect(self, entity_ids, edges):
        return leiden_levels(
            edges,
            resolution=graph_setting("RESOLUTION") if self.resolution is None else self.resolution,
            levels=graph_setting("LEVELS") if self.levels is None else self.levels,
            max_cluster_size=graph_setting("MAX_CLUSTER_SIZE")
            if self.max_cluster_size is None
            else self.max_cluster_size,
            seed=graph_setting("SEED") if self.seed is None else self.seed,
        )


def _positional_arity(function: Callable[..., Any]) -> int | None:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


class CallableCommunityDetector(CommunityDetector):
    """A function as a detector: ``(entities, relationships, options) -> levels`` when it
    takes three arguments, the older ``(entity_ids, edges) -> levels`` when it takes two."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        self.name = getattr(function, "__qualname__", type(function).__name__)
        self.rich = _positional_arity(function) == 3

    def partition(self, entities, relationships, options):
        if self.rich:
            return self.function(list(entities), list(relationships), dict(options))
        return super().partition(entities, relationships, options)

    def detect(self, entity_ids, edges):
        return self.function(entity_ids, edges)


class CommunitySummarizer:
    """Writes a community's summary (``GRAPH["COMMUNITY_SUMMARIZER"]``, or
    ``summarize_communities(summarizer=...)``; None: the LLM summary). :meth:`summarize`
    gets the member :class:`~django_rag.models.Entity` rows and the
    :class:`~django_rag.models.Relationship` rows among them and returns the text (empty:
    not summarised). It runs on worker threads: it must not use the database."""

    name = "custom"

    def summarize(self, entities: Sequence[Entity], relationships: Sequence[Relationship]) -> str:
        raise NotImplementedError


class CallableCommunitySummarizer(CommunitySummarizer):
    """A function ``(entities, relationships) -> str`` as a summarizer."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        self.name = getattr(function, "__qualname__", type(function).__name__)

    def summarize(self, entities, relationships):
        return self.function(entities, relationships)


DETECTOR_ALIASES = {"leiden": "django_rag.graph.communities.LeidenDetector"}


class _Configured:
    """The value of ``detector=`` when it is left out: the configured detector. (``None`` and
    ``False`` are taken: they switch detection off.)"""

    def __repr__(self) -> str:
        return "CONFIGURED"


#: ``detect_communities(detector=CONFIGURED)``, the default: ``GRAPH["COMMUNITY_DETECTOR"]``.
CONFIGURED: Any = _Configured()


def get_detector(spec: Any = CONFIGURED) -> CommunityDetector | None:
    """The community detector ``spec`` names (:data:`CONFIGURED`, the default:
    ``GRAPH["COMMUNITY_DETECTOR"]``): an alias (``"leiden"``), a dotted path, a class, an
    instance, a ``{"BACKEND", "OPTIONS"}`` dict or a function; None for ``None`` or ``False``
    (detection off)."""
    if spec is CONFIGURED:
        spec = graph_setting("COMMUNITY_DETECTOR")
    if spec is None or spec is False:
        return None
    return build_component(
        spec,
        setting="GRAPH.COMMUNITY_DETECTOR",
        base=CommunityDetector,
        aliases=DETECTOR_ALIASES,
        wrap_callable=CallableCommunityDetector,
    )


def get_summarizer(spec: Any = None) -> CommunitySummarizer | None:
    """The community summarizer ``spec`` names (None: ``GRAPH["COMMUNITY_SUMMARIZER"]``),
    or None for the built-in LLM summary."""
    spec = graph_setting("COMMUNITY_SUMMARIZER") if spec is None else spec
    if spec is None or spec == "llm":
        return None
    return build_component(
        spec,
        setting="GRAPH.COMMUNITY_SUMMARIZER",
        base=CommunitySummarizer,
        aliases={},
        wrap_callable=CallableCommunitySummarizer,
    )


def checked_levels(
    detector: CommunityDetector, result: Any, entity_ids: Sequence[int]
) -> list[list[list[int]]]:
    """A detector's answer as levels of communities of known entity ids, or
    :class:`~django_rag.exceptions.InvalidOption` saying what is wrong with it (a detector
    that is not ours is checked like input: bounded, typed, ids that exist)."""

    def refuse(problem: str) -> InvalidOption:
        return InvalidOption(
            f"The community detector {detector.name!r} returned {problem}: return a list of "
            "levels, each a list of communities (lists of entity ids of the collection)."
        )

    if not isinstance(result, list | tuple):
        return_type = type(result).__name__
        raise refuse(f"a {return_type}")
    levels = list(result)
    if levels and all(
        isinstance(c, list | tuple) and all(isinstance(i, int) for i in c) for c in levels
    ):
        levels = [levels]  # one partition: one level
    if len(levels) > MAX_DETECTED_LEVELS:
        raise refuse(f"{len(levels)} levels (at most {MAX_DETECTED_LEVELS})")
    known = set(entity_ids)
    checked = []
    for level in levels:
        if not isinstance(level, list | tuple):
            raise refuse(f"a level that is a {type(level).__name__}")
        partition = []
        for community in level:
            if not isinstance(community, list | tuple):
                raise refuse(f"a community that is a {type(community).__name__}")
            members = []
            for member in community:
                if isinstance(member, bool) or not isinstance(member, int):
                    raise refuse(f"a member {member!r:.40} that is not an entity id")
                if member not in known:
                    raise refuse(f"entity id {member}, not one of the collection's")
                if member not in members:
                    members.append(member)
            if members:
                partition.append(sorted(members))
        checked.append(sorted(partition))
    return checked


def detect_communities(
    collection: str | None = None,
    *,
    resolution: float | None = None,
    levels: int | None = None,
    max_cluster_size: int | None = None,
    min_size: int | None = None,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    detector: Any = CONFIGURED,
    isolated: bool | None = None,
    graph_store: Any = None,
) -> dict[str, int]:
    """Detect the communities of each collection's graph and replace the stored ones.

    The new partition is computed before anything is deleted, so a failure keeps the old
    communities. Summaries carry over to a community with the same level and members; when its
    content fingerprint changed it is marked dirty (re-summarised later).

    ``detector`` (left out: ``GRAPH["COMMUNITY_DETECTOR"]``, ``"leiden"``) is any
    :class:`CommunityDetector` form; ``None`` or ``False`` switches detection off: nothing is
    computed, the stored communities stay as they are, and the result counts no collection.
    Leiden's options come from this call, else the detector's own ``OPTIONS``, else the
    ``GRAPH`` settings; ``levels`` and ``min_size`` apply to every detector.

    ``isolated`` (default ``GRAPH["ISOLATED_COMMUNITIES"]``): each entity no community of a
    level holds gets a community of its own at that level (whatever ``min_size``), so every
    entity can be reached through a community. ``graph_store``: where the graph is read and
    the communities written (default ``GRAPH["STORE"]``).
    """
    component = get_detector(detector)
    if isinstance(component, LeidenDetector):
        resolution = component.resolution if resolution is None else resolution
        levels = component.levels if levels is None else levels
        max_cluster_size = (
            component.max_cluster_size if max_cluster_size is None else max_cluster_size
        )
        seed = component.seed if seed is None else seed
    options = {
        "resolution": graph_setting("RESOLUTION") if resolution is None else resolution,
        "levels": graph_setting("LEVELS") if levels is None else levels,
        "max_cluster_size": (
            graph_setting("MAX_CLUSTER_SIZE") if max_cluster_size is None else max_cluster_size
        ),
        "min_size": graph_setting("MIN_SIZE") if min_size is None else min_size,
        "seed": graph_setting("SEED") if seed is None else seed,
    }
    isolated = graph_setting("ISOLATED_COMMUNITIES") if isolated is None else isolated
    clean_positive_int("levels", options["levels"])
    clean_number("resolution", options["resolution"], minimum=0, strict_minimum=True)
    clean_positive_int("min_size", options["min_size"])
    clean_positive_int("max_cluster_size", options["max_cluster_size"])
    seed = options["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidOption(f"seed must be an integer or None, got {seed!r}")
    if not isinstance(isolated, bool):
        raise InvalidOption(f"isolated must be True or False, got {isolated!r}")
    if collection is not None:
        clean_collection_name(collection)
    targets = _collections(collection)
    if component is None:
        return {"collections": 0, "communities": 0}
    store = get_graph_store(graph_store)
    total = 0
    with span("graph.community_detection", collection=collection, detector=component.name) as s:
        for index, target in enumerate(targets, start=1):
            entities = store.find([target.pk])
            relationships = store.relationships(target.pk)
            ids = [e.pk for e in entities]
            result = component.partition(entities, relationships, dict(options))
            if not isinstance(component, LeidenDetector):
                result = checked_levels(component, result, ids)
            partitions = [
                [members for members in level if len(members) >= options["min_size"]]
                for level in result[: options["levels"]]
            ]
            if isolated:
                partitions = with_isolated(partitions or [[]], ids)
            total += store.replace_communities(target.pk, partitions)
            if progress:
                progress(index, len(targets))
        s.set(community_count=total)
    return {"collections": len(targets), "communities": total}


def with_isolated(partitions: list[list[list[int]]], ids: Sequence[int]) -> list[list[list[int]]]:
    """Each level with a one-entity community for every entity it leaves out."""
    levels = []
    for partition in partitions:
        held = {pk for members in partition for pk in members}
        levels.append(sorted(partition + [[pk] for pk in ids if pk not in held]))
    return levels


def needs_summary(community: Community, current_fingerprint: str, threshold: int) -> bool:
    """No summary yet, content changed since it was written, marked dirty, or too many
    changes accumulated (``change_count >= threshold``)."""
    return (
        not community.summary
        or community.dirty
        or community.fingerprint != current_fingerprint
        or community.change_count >= threshold
    )


def _summary_todo(
    collection: str | None, store: Any, levels: Any, threshold: int | None, force: bool
) -> tuple[int, list[tuple[Community, list, list, str]]]:
    """The communities checked, and those to summarise with their members, relationships and
    current fingerprint: the ``levels`` (default ``GRAPH["SUMMARY_LEVELS"]``) of ``collection``
    (None: every collection) that :func:`needs_summary` selects (all of them with ``force``)."""
    levels = graph_setting("SUMMARY_LEVELS") if levels is None else levels
    if levels != "all":
        levels = [levels] if isinstance(levels, int) else list(levels)
        if not levels or any(not isinstance(v, int) or v < 0 for v in levels):
            raise InvalidOption(f"levels must be non-negative integers or 'all', got {levels!r}")
    threshold = graph_setting("SUMMARY_THRESHOLD") if threshold is None else threshold
    todo = []
    checked = 0
    for target in _collections(collection):
        communities = store.communities([target.pk], levels=None if levels == "all" else levels)
        for community in communities:
            checked += 1
            entities = store.find(ids=community.entity_ids)
            relationships = store.relationships(among=community.entity_ids)
            current = fingerprint(entities, relationships)
            if force or needs_summary(community, current, threshold):
                todo.append((community, entities, relationships, current))
    return checked, todo


def communities_to_summarize(
    collection: str | None = None,
    *,
    levels: Sequence[int] | str | None = None,
    threshold: int | None = None,
    graph_store: Any = None,
) -> int:
    """How many communities :func:`summarize_communities` with these arguments would summarise
    now (the same levels and :func:`needs_summary`), calling no LLM and writing nothing. It
    reads each community's members and relationships to compare fingerprints."""
    store = get_graph_store(graph_store)
    return len(_summary_todo(collection, store, levels, threshold, False)[1])


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


@rejects_unknown_options("summarize_community()")
def summarize_community(
    entities: Sequence[Entity],
    relationships: Sequence[Relationship],
    *,
    llm: Any = None,
    summarizer: Any = None,
) -> str:
    """A summary of any group of entities and the relationships among them, stored nowhere:
    the text :func:`summarize_communities` would store for a community with these members.

    ``summarizer`` (default ``GRAPH["COMMUNITY_SUMMARIZER"]``; None: the LLM ``llm``, default
    ``DJANGO_RAG["LLM"]``) is any :class:`CommunitySummarizer` form. What it returns is
    checked (a string, NULs removed, at most :data:`MAX_SUMMARY_CHARS`); an LLM failure raises
    :class:`~django_rag.exceptions.LLMError`, a summarizer that does not return text
    :class:`~django_rag.exceptions.InvalidOption`."""
    component = get_summarizer(summarizer)
    model = get_llm(llm, feature="Community summaries") if component is None else None
    return _summarize(component, model, list(entities), list(relationships))


def _summarize(component: CommunitySummarizer | None, model: Any, entities, relationships) -> str:
    name = "llm" if component is None else component.name
    with span("graph.community_summary", entity_count=len(entities), summarizer=name) as s:
        if component is None:
            text = model.complete(summary_prompt(entities, relationships)).text.strip()
        else:
            text = component.summarize(entities, relationships)
            if not isinstance(text, str):
                raise InvalidOption(
                    f"the community summarizer {name!r} returned a "
                    f"{type(text).__name__}, not a string"
                )
            text = text.replace("\x00", "").strip()
        text = text[:MAX_SUMMARY_CHARS]
        s.set(summary_length=len(text))
    return text


@rejects_unknown_options("summarize_communities()")
def summarize_communities(
    collection: str | None = None,
    *,
    llm: Any = None,
    force: bool = False,
    levels: Sequence[int] | str | None = None,
    concurrency: int | None = None,
    threshold: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    summarizer: Any = None,
    graph_store: Any = None,
) -> dict[str, int]:
    """Summarise the communities that need it (see :func:`needs_summary`), ``concurrency`` LLM
    calls at once. ``levels``: a list of levels, ``"all"``, or ``GRAPH["SUMMARY_LEVELS"]``.
    A failed call leaves that community as it was (counted in ``failed``).

    ``summarizer`` (default ``GRAPH["COMMUNITY_SUMMARIZER"]``; None: the LLM) writes the
    summaries instead of the LLM: any :class:`CommunitySummarizer` form (no LLM is needed
    then). An exception it raises, or a reply that is not text, counts as a failure.
    ``graph_store``: where the communities are read and written (default ``GRAPH["STORE"]``).
    :func:`summarize_community` summarises a group of entities without storing anything."""
    component = get_summarizer(summarizer)
    model = get_llm(llm, feature="Community summaries") if component is None else None
    store = get_graph_store(graph_store)
    concurrency = concurrency or graph_setting("SUMMARY_CONCURRENCY")
    checked, todo = _summary_todo(collection, store, levels, threshold, force)

    def summarize(item) -> str:
        # LLM calls only: threads must not touch the database (their connections would not see
        # this transaction's rows).
        community, entities, relationships, current = item
        name = "llm" if component is None else component.name
        try:
            return _summarize(component, model, entities, relationships)
        except LLMError as exc:
            logger.warning("Community %s not summarised: %s", community.pk, exc)
        except Exception as exc:  # a summarizer that is not ours: its failure is one
            logger.warning(
                "Community %s not summarised: the summarizer %r raised %s: %s",
                community.pk,
                name,
                type(exc).__name__,
                scrub_text(exc)[:300],
            )
        return ""

    texts = map_concurrently(summarize, todo, concurrency)
    written = 0
    for (community, _, _, current), text in zip(todo, texts, strict=True):
        if text:
            store.save_summary(community.pk, text, current)
            written += 1
    if progress:
        progress(len(todo), len(todo))
    return {"communities": checked, "summaries": written, "failed": len(todo) - written}

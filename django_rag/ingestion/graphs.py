"""The graph part of ingest: which extractor a call uses (the configured one, or Arcana's
per-call ``extractor=`` / ``entity_extractor=`` / ``relationship_extractor=``) and the
extraction of a document's chunks before its write (docs/graphrag.md, "Per-call extractors")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..conf import graph_setting
from ..exceptions import InvalidOption
from ..graph.builder import extract_all
from ..graph.extractors import GraphExtractor, get_extractor
from ..graph.names import normalize_name
from ..signals import span
from ..store.graph_stores import GraphExtractions, get_graph_store
from .prepare import PreparedChunk


def use_graph(
    graph: bool | None,
    extractor: Any = None,
    entity_extractor: Any = None,
    relationship_extractor: Any = None,
) -> bool | GraphExtractor:
    """Whether to extract the graph: False, True (the configured extractor) or the
    :class:`GraphExtractor` a call gave (``extractor=``, or ``entity_extractor=`` /
    ``relationship_extractor=``: Arcana's per-call extractors). Giving one turns the graph on
    when ``graph`` is left out; with ``graph=False`` it raises ``InvalidOption``."""
    if extractor is None and entity_extractor is None and relationship_extractor is None:
        return bool(graph_setting("ENABLED") if graph is None else graph)
    if graph is False:
        raise InvalidOption(
            "extractor=, entity_extractor= and relationship_extractor= extract the graph: "
            "leave graph out or pass graph=True."
        )
    return get_extractor(
        extractor, entity_extractor=entity_extractor, relationship_extractor=relationship_extractor
    )


def refuse_background_extractors(*components: Any) -> None:
    """A background ingest runs in a worker that cannot receive per-call components (graph
    extractors, a graph store)."""
    if any(x is not None for x in components):
        raise InvalidOption(
            "background=True uses the configured graph extractor and store (a worker cannot "
            "receive per-call components): set GRAPH['EXTRACTOR'] / GRAPH['STORE'], or ingest "
            "in the foreground."
        )


def extract_graph(
    chunks: Sequence[PreparedChunk],
    collection: str,
    extractor: Any = None,
    *,
    graph_store: Any = None,
) -> GraphExtractions:
    """Entities and relationships of the chunks, found before the write transaction opens
    (LLM calls must not hold it), in a ``graph.build`` span as a :func:`build_graph` run emits
    (``ingest=True``; its counts are those found in this document's chunks). ``extractor``:
    the call's own (a :class:`GraphExtractor`), else the configured one. The write path stores
    them in ``graph_store`` (None: ``GRAPH["STORE"]``), checked here, before any work."""
    if graph_store is not None:
        get_graph_store(graph_store)
    if not isinstance(extractor, GraphExtractor):
        extractor = get_extractor()
    with span(
        "graph.build",
        collection=collection,
        resume=True,
        ingest=True,
        extractor=type(extractor).__name__,
    ) as s:
        extractions, failed = extract_all(
            [item.chunk.text for item in chunks], extractor, graph_setting("CONCURRENCY")
        )
        entities = {normalize_name(e.name) for x in extractions for e in x.entities}
        relationships = {
            (normalize_name(r.source), normalize_name(r.target), r.type)
            for x in extractions
            for r in x.relationships
        }
        s.set(
            chunks=len(chunks),
            failed=failed,
            entities=len(entities - {""}),
            relationships=len(relationships),
        )
    return GraphExtractions(extractions, graph_store)

"""Building the graph: extract from chunks, persist with deduplication, sweep orphans."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef

from ..conf import graph_setting
from ..exceptions import LLMError, UnknownCollection
from ..llm import map_concurrently
from ..models import Chunk, Collection, Entity, GraphChunk, Relationship
from ..models.databases import write_db
from ..signals import span
from ..store.graph import (  # noqa: F401 (re-exported)
    delete_graph,
    lock_collection_graph,
    persist,
    sweep_orphans,
)
from ..validation import clean_collection_name
from .extractors import Extraction, GraphExtractor, bounded, get_extractor

logger = logging.getLogger(__name__)


def extract_all(
    texts: Sequence[str], extractor: GraphExtractor, concurrency: int
) -> tuple[list[Extraction], int]:
    """Extract from every text (``concurrency`` at once). A chunk whose LLM call fails or
    answers nonsense contributes nothing and is counted; other errors are raised."""
    failures = 0

    def one(text: str) -> Extraction | None:
        try:
            return bounded(extractor.extract(text))
        except LLMError as exc:
            logger.warning("Graph extraction skipped a chunk: %s", exc)
            return None

    results = map_concurrently(one, list(texts), concurrency)
    extractions = []
    for result in results:
        if result is None:
            failures += 1
            result = Extraction()
        extractions.append(result)
    return extractions, failures


def build_graph(
    collection: str | None = None,
    *,
    resume: bool = True,
    extractor: Any = None,
    entity_extractor: Any = None,
    relationship_extractor: Any = None,
    llm: Any = None,
    concurrency: int | None = None,
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Extract the graph of a collection's chunks (or every collection's).

    Incremental by default: only chunks not processed yet. ``resume=False`` deletes the
    collection's graph first and rebuilds it. Each batch of ``batch_size`` chunks is extracted
    (``concurrency`` chunks at once) and then stored in one transaction.

    Returns ``chunks`` (processed), ``failed`` (chunks whose extraction failed), ``mentions``
    (entity mentions extracted) and ``entities`` / ``relationships``: how many the built
    collections' graph holds afterwards (distinct rows, as the dashboard and admin count them;
    an entity found in many chunks counts once).
    """
    if collection is not None:
        collection = clean_collection_name(collection)
    # Read where the graph is written: a lagging replica would offer chunks already processed
    # (or, after a rebuild's delete, hide them).
    db = write_db()
    collections = Collection.objects.using(db)
    names = [collection] if collection else list(collections.values_list("name", flat=True))
    collections = list(collections.filter(name__in=names))
    if collection and not collections:
        raise UnknownCollection(collection)
    graph_extractor = get_extractor(
        extractor,
        entity_extractor=entity_extractor,
        relationship_extractor=relationship_extractor,
        llm=llm,
    )
    concurrency = concurrency or graph_setting("CONCURRENCY")
    totals = {"chunks": 0, "entities": 0, "relationships": 0, "mentions": 0, "failed": 0}
    with span("graph.build", collection=collection, resume=resume) as s:
        for target in collections:
            if not resume:
                delete_graph(target.pk)
            chunks = (
                Chunk.objects.using(db)
                .filter(collection=target)
                .exclude(Exists(GraphChunk.objects.using(db).filter(chunk=OuterRef("pk"))))
            )
            todo = list(chunks.order_by("pk").values_list("pk", "text"))
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                extractions, failed = extract_all(
                    [text for _, text in batch], graph_extractor, concurrency
                )
                with transaction.atomic(using=db):
                    counts = persist(target.pk, [pk for pk, _ in batch], extractions)
                totals["chunks"] += len(batch)
                totals["failed"] += failed
                totals["mentions"] += counts["mentions"]
                if progress:
                    progress(min(start + batch_size, len(todo)), len(todo))
        built = [target.pk for target in collections]
        totals["entities"] = Entity.objects.using(db).filter(collection_id__in=built).count()
        totals["relationships"] = (
            Relationship.objects.using(db).filter(source__collection_id__in=built).count()
        )
        s.set(**totals)
    return totals

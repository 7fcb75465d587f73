"""Building the graph: extract from chunks, persist with deduplication, sweep orphans."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from ..conf import graph_setting
from ..exceptions import DocumentNotFound, InvalidOption, LLMError, UnknownCollection
from ..llm import map_concurrently
from ..models import Chunk, Collection, Document
from ..models.databases import write_db
from ..signals import span
from ..store.graph import lock_collection_graph  # noqa: F401 (re-exported)
from ..store.graph_stores import get_graph_store
from ..validation import clean_collection_name, clean_positive_int
from .extractors import Extraction, GraphExtractor, bounded, get_extractor

logger = logging.getLogger(__name__)


def extract_all(
    texts: Sequence[str], extractor: GraphExtractor, concurrency: int
) -> tuple[list[Extraction], int]:
    """Extract from every text, ``extractor.batch_size`` texts per call and ``concurrency``
    calls at once. A call that fails or answers nonsense contributes nothing for its chunks,
    which are counted; other errors are raised."""
    size = max(1, int(getattr(extractor, "batch_size", 1) or 1))
    groups = [list(texts[i : i + size]) for i in range(0, len(texts), size)]

    def one(group: list[str]) -> list[Extraction | None]:
        try:
            found = extractor.extract(group[0]) if len(group) == 1 else None
            found = [found] if found is not None else extractor.extract_batch(group)
            if len(found) != len(group):
                raise LLMError(
                    f"the extractor returned {len(found)} extractions for {len(group)} chunks"
                )
            return [bounded(item) for item in found]
        except LLMError as exc:
            logger.warning("Graph extraction skipped %d chunk(s): %s", len(group), exc)
            return [None] * len(group)

    failures = 0
    extractions = []
    for result in (r for group in map_concurrently(one, groups, concurrency) for r in group):
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
    graph_store: Any = None,
    document: int | None = None,
) -> dict[str, int]:
    """Extract the graph of a collection's chunks (or every collection's, or one document's).

    Incremental by default: only chunks not processed yet. ``resume=False`` deletes the
    collection's graph first and rebuilds it. Each batch of ``batch_size`` chunks is extracted
    (``concurrency`` extractor calls at once) and then stored in one transaction, in
    ``graph_store`` (default ``GRAPH["STORE"]``).

    ``document`` (a document id) extracts that document's chunks not processed yet, into its
    collection's graph (``collection`` may be omitted; ``resume=False`` is refused, since a
    rebuild deletes the whole collection's graph); an unknown id raises
    :class:`~django_rag.exceptions.DocumentNotFound`.

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
    chunks_of = Chunk.objects.using(db)
    if document is not None:
        document = clean_positive_int("document", document)
        if not resume:
            raise InvalidOption(
                "build_graph(document=...) adds to the graph: resume=False is for a whole collection"
            )
        owner = (
            Document.objects.using(db)
            .filter(pk=document)
            .values_list("collection__name", flat=True)
            .first()
        )
        if owner is None or (collection is not None and owner != collection):
            raise DocumentNotFound(
                f"No document {document}"
                + (f" in the collection {collection!r}" if collection else "")
                + "."
            )
        collection = owner
        chunks_of = chunks_of.filter(document_id=document)
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
    store = get_graph_store(graph_store)
    concurrency = concurrency or graph_setting("CONCURRENCY")
    totals = {"chunks": 0, "entities": 0, "relationships": 0, "mentions": 0, "failed": 0}
    with span("graph.build", collection=collection, resume=resume, document=document) as s:
        for target in collections:
            if not resume:
                store.delete(target.pk)
            chunks = store.pending_chunks(chunks_of.filter(collection=target))
            todo = list(chunks.order_by("pk").values_list("pk", "text"))
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                extractions, failed = extract_all(
                    [text for _, text in batch], graph_extractor, concurrency
                )
                with transaction.atomic(using=db):
                    counts = store.persist(target.pk, [pk for pk, _ in batch], extractions)
                totals["chunks"] += len(batch)
                totals["failed"] += failed
                totals["mentions"] += counts["mentions"]
                if progress:
                    progress(min(start + batch_size, len(todo)), len(todo))
        totals.update(store.counts([target.pk for target in collections]))
        s.set(**totals)
    return totals


def delete_graph(collection_id: int, *, graph_store: Any = None) -> None:
    """Remove a collection's whole graph (entities, mentions, relationships, communities)."""
    get_graph_store(graph_store).delete(collection_id)


def sweep_orphans(collection_id: int, *, graph_store: Any = None) -> int:
    """Delete the collection's entities no chunk mentions any more; returns how many."""
    return get_graph_store(graph_store).sweep(collection_id)

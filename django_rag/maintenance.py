"""Maintenance services: re-embedding (with a zero-downtime model switch), chunk headers,
orphans, the vector and full-text indexes, info.

Plain functions: the management commands, Celery tasks and the dashboard call them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from . import background, embeddings
from .answers.grounding import get_grounder
from .conf import call_defaults, embedding_dimensions, get_setting, get_settings, redact, scrub_text
from .embeddings import Embedder, configured_embedder, get_embedder
from .exceptions import DimensionMismatch, InvalidInput, UnknownCollection
from .ingestion.headers import chunk_headers, headers_enabled
from .ingestion.parsers import parser_formats
from .llm import map_concurrently
from .models import Chunk, Collection, Document, Entity, Job, textsearch
from .models.databases import write_db
from .models.managers import pgvector_version
from .models.textsearch import fulltext_backend
from .rerankers import get_reranker
from .signals import span
from .store import schema
from .store.graph import write_entity_vectors
from .store.headers import HEADER_KEY, header_of, with_header
from .store.statistics import index_chunks
from .store.vector_stores import sync_all_vectors

logger = logging.getLogger(__name__)

SWITCH = Job.Kind.SWITCH
REEMBED = Job.Kind.REEMBED
Progress = Callable[[int, int], None]


def preload_models() -> list[str]:
    """Load the configured local models now: ``EMBEDDER``, ``NEXT_EMBEDDER`` and ``RERANKER``
    (an API embedder or an LLM reranker loads nothing and is not called). Returns their names.

    Called at start-up of web processes and Celery workers when ``PRELOAD_MODELS`` is True, so
    the first search does not wait for a model. No database access: ``ready()`` may call it.
    """
    names = []
    for setting in ("EMBEDDER", "NEXT_EMBEDDER"):
        embedder = configured_embedder(setting)
        if embedder is not None:
            with span("preload", setting=setting, model=embedder.model_name):
                embedder.preload()
            names.append(embedder.model_name)
    ranker = get_reranker()
    if ranker is not None:
        with span("preload", setting="RERANKER", model=ranker.name):
            ranker.preload()
        names.append(getattr(ranker, "model_name", ranker.name))
    return names


def _embed(embedder: Embedder, texts: list[str], dimensions: int) -> list[list[float]]:
    vectors = embedder.embed_documents(texts)
    if vectors and len(vectors[0]) != dimensions:
        raise DimensionMismatch(
            f"{embedder.model_name} returned {len(vectors[0])}-dimensional vectors, expected "
            f"{dimensions}."
        )
    return vectors


def _inputs(chunks) -> list[tuple[int, str]]:
    """``(id, text to embed)`` of these chunks: the text with its chunk header, as at ingest
    (django_rag.store.headers), so re-embedding keeps what ingest embedded."""
    return [
        (pk, with_header(text, header_of(metadata)))
        for pk, text, metadata in chunks.values_list("pk", "text", "metadata")
    ]


def _run_batches(
    fetch: Callable[[int], list[tuple[int, str]]],
    embedder: Embedder,
    dimensions: int,
    job: Job,
    *,
    batch_size: int,
    concurrency: int,
    progress: Progress | None,
    shadow: bool = False,
) -> None:
    """Fetch rows needing vectors, embed ``concurrency`` batches at once, write each batch
    (to the shadow column with ``shadow``) with the job's progress."""
    while rows := fetch(batch_size * concurrency):
        batches = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        embedded = map_concurrently(
            lambda batch: _embed(embedder, [text for _, text in batch], dimensions),
            batches,
            concurrency,
        )
        for batch, vectors in zip(batches, embedded, strict=True):
            ids = [pk for pk, _ in batch]

            def advance(ids=ids) -> None:
                job.done += len(ids)
                job.cursor = max(ids)
                job.save(update_fields=["done", "cursor", "updated_at"])

            schema.write_vectors(ids, vectors, embedder.model_name, shadow=shadow, after=advance)
            job.total = max(job.total, job.done)
            if progress:
                progress(job.done, job.total)


def _job(kind: str, params: dict[str, Any], resume: bool, job: Job | None) -> Job:
    if job is not None:
        # A job created by the caller (a queued task): it takes this kind and these params,
        # keeping the options it was queued with.
        options = job.params.get("options", job.params if job.kind != kind else {})
        job.kind = kind
        job.params = {**params, "options": options}
        job.save(update_fields=["kind", "params", "updated_at"])
    if job is None and resume:
        job = (
            Job.objects.filter(kind=kind, **{f"params__{k}": v for k, v in params.items()})
            .exclude(status=Job.Status.COMPLETED)
            .order_by("-id")
            .first()
        )
    if job is None:
        job = Job.objects.create(kind=kind, params=params)
    job.start()
    return job


def _finish(job: Job, result: dict[str, Any]) -> Job:
    job.finish(result)
    return job


def reembed(
    *,
    collection: str | None = None,
    batch_size: int = 64,
    concurrency: int = 1,
    all: bool = False,
    resume: bool = False,
    progress: Progress | None = None,
    job: Job | None = None,
) -> Job:
    """Re-embed stored chunks in batches, each written in its own transaction.

    - With ``DJANGO_RAG["NEXT_EMBEDDER"]`` set: switch every chunk to that model without
      downtime (see :func:`switch_embedder`).
    - With ``all=True``: re-embed every chunk with the current embedder, also without downtime.
    - Otherwise: re-embed, in place, the chunks whose ``embedding_model`` differs from the
      current embedder's (optionally of one ``collection``).

    Every batch writes its vectors and the job's progress together, so a run killed at any
    point loses at most the batch in flight; running again (``resume=True`` continues the same
    job) re-embeds only what was not written.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidInput(f"concurrency must be a positive integer, got {concurrency!r}")
    upcoming = configured_embedder("NEXT_EMBEDDER")
    if upcoming is not None or all:
        if collection is not None:
            raise InvalidInput(
                "A model switch re-embeds every chunk: --collection cannot be combined with "
                "NEXT_EMBEDDER or --all."
            )
        target = upcoming or configured_embedder("EMBEDDER")
        return switch_embedder(
            target,
            batch_size=batch_size,
            concurrency=concurrency,
            resume=resume,
            progress=progress,
            job=job,
        )
    return _reembed_in_place(collection, batch_size, concurrency, resume, progress, job)


def _reembed_in_place(collection, batch_size, concurrency, resume, progress, job) -> Job:
    embedder = get_embedder()
    dimensions = embedding_dimensions()
    # Read where the vectors are written: a lagging replica would hand out batches again.
    db = write_db()
    chunks = Chunk.objects.using(db).exclude(embedding_model=embedder.model_name)
    if collection is not None:
        if not Collection.objects.using(db).filter(name=collection).exists():
            raise UnknownCollection(collection)
        chunks = chunks.filter(collection__name=collection)
    params = {"model": embedder.model_name, "collection": collection}
    job = _job(REEMBED, params, resume, job)
    job.total = job.done + chunks.count()
    job.save(update_fields=["total", "updated_at"])
    try:
        with span("reembed", model=embedder.model_name, collection=collection) as s:
            _run_batches(
                lambda limit: _inputs(chunks.order_by("pk")[:limit]),
                embedder,
                dimensions,
                job,
                batch_size=batch_size,
                concurrency=concurrency,
                progress=progress,
            )
            s.set(reembedded=job.done)
            # Entities of another model (same size, or its vectors would not fit) would keep
            # matching queries of the new model against the old model's vectors.
            entities = embed_entities(embedder, collection=collection, batch_size=batch_size)
            s.set(entities=entities)
    except BaseException as exc:
        job.fail(exc)
        raise
    return _finish(
        job, {"reembedded": job.done, "entities": entities, "model": embedder.model_name}
    )


def reembed_documents(document_ids: Sequence[int], *, batch_size: int = 64) -> Job:
    """Re-embed every chunk of these documents with the current embedder, in place."""
    embedder = get_embedder()
    chunks = Chunk.objects.using(write_db()).filter(document_id__in=list(document_ids))
    job = _job(
        REEMBED, {"model": embedder.model_name, "documents": list(document_ids)}, False, None
    )
    job.total = chunks.count()
    job.save(update_fields=["total", "updated_at"])
    cursor = {"last": 0}

    def fetch(limit: int) -> list[tuple[int, str]]:
        rows = _inputs(chunks.filter(pk__gt=cursor["last"]).order_by("pk")[:limit])
        if rows:
            cursor["last"] = rows[-1][0]
        return rows

    try:
        _run_batches(
            fetch,
            embedder,
            embedding_dimensions(),
            job,
            batch_size=batch_size,
            concurrency=1,
            progress=None,
        )
    except BaseException as exc:
        job.fail(exc)
        raise
    return _finish(job, {"reembedded": job.done, "model": embedder.model_name})


# --- zero-downtime switch ---------------------------------------------------------------------


def switch_embedder(
    embedder: Embedder,
    *,
    batch_size: int = 64,
    concurrency: int = 1,
    resume: bool = False,
    progress: Progress | None = None,
    job: Job | None = None,
) -> Job:
    """Move every chunk to ``embedder``'s vectors without downtime.

    New vectors go to a shadow column (``embedding_next``, sized for the new model) batch by
    batch while searches keep using the current column and the current model. When every
    chunk has one (chunks ingested meanwhile included), an HNSW index is built on the shadow
    column and, in one transaction, the shadow column replaces the current one. From that
    commit on, every process embeds queries and new chunks with the new model (when it is
    ``NEXT_EMBEDDER``). A run that stops leaves the shadow column for the next run to finish.
    """
    dimensions = embedder.dimensions
    params = {"model": embedder.model_name, "dimensions": dimensions}
    job = _job(SWITCH, params, resume, job)
    try:
        # Refused before any work when the configured index type cannot hold its vectors.
        schema.check_switch(dimensions)
        with span("reembed", model=embedder.model_name, switch=True) as s:
            # A new job over a leftover shadow column of the same model keeps its vectors.
            schema.prepare_shadow(dimensions, fresh=False)
            pending, total = schema.shadow_progress()
            job.total = total
            job.done = total - pending
            job.save(update_fields=["total", "done", "updated_at"])
            _fill_shadow(embedder, dimensions, job, batch_size, concurrency, progress)
            _swap(embedder, dimensions, batch_size, job)
            s.set(reembedded=job.done)
    except BaseException as exc:
        job.fail(exc)
        raise
    return _finish(job, {"reembedded": job.done, "model": embedder.model_name})


def _fill_shadow(embedder, dimensions, job, batch_size, concurrency, progress) -> None:
    """Give every chunk still lacking one a vector in the shadow column."""
    _run_batches(
        schema.pending_shadow,
        embedder,
        dimensions,
        job,
        batch_size=batch_size,
        concurrency=concurrency,
        progress=progress,
        shadow=True,
    )


def _swap(embedder: Embedder, dimensions: int, batch_size: int, job: Job) -> None:
    schema.index_shadow()
    with transaction.atomic(using=write_db()):
        # Writers wait from here to the commit; readers keep reading the current column.
        schema.lock_chunk_writes()
        # Chunks ingested since the last batch.
        _fill_shadow(embedder, dimensions, job, batch_size, 1, None)
        schema.swap_shadow(dimensions)
        Job.objects.filter(kind=SWITCH, params__model=embedder.model_name).exclude(
            status=Job.Status.COMPLETED
        ).update(status=Job.Status.COMPLETED, finished_at=timezone.now())
    embeddings.forget_switch(embedder.model_name)  # every database's cached answer
    embed_entities(embedder, batch_size=batch_size)
    # Every chunk has a new vector: hand them to a store that keeps its own copy.
    sync_all_vectors()


def embed_entities(
    embedder: Embedder | None = None,
    *,
    collection: str | None = None,
    force: bool = False,
    batch_size: int = 64,
) -> int:
    """Embed graph entities (``"name: description"``) with ``embedder`` (default: the current
    one); returns how many.

    Embedded are the entities without a vector and those whose vector another model made
    (``embedding_model`` differs: a switch to a model of the same size, or rows stored before
    the model was recorded); ``force=True`` re-embeds every entity. ``collection`` limits it to
    one collection (an unknown name raises :class:`~django_rag.exceptions.UnknownCollection`).
    ``rag_reembed`` runs it after the chunks; run it yourself to backfill entities stored while
    embedding failed."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    embedder = embedder or get_embedder()
    db = write_db()
    entities = Entity.objects.using(db)
    if collection is not None:
        if not Collection.objects.using(db).filter(name=collection).exists():
            raise UnknownCollection(collection)
        entities = entities.filter(collection__name=collection)
    if not force:
        entities = entities.filter(
            models.Q(embedding__isnull=True) | ~models.Q(embedding_model=embedder.model_name)
        )
    done, last = 0, 0
    # Walk by primary key: with force=True every row keeps matching the filter once written.
    while batch := list(
        entities.filter(pk__gt=last)
        .order_by("pk")
        .values_list("pk", "name", "description")[:batch_size]
    ):
        texts = [
            f"{name}: {description}" if description else name for _, name, description in batch
        ]
        vectors = embedder.embed_documents(texts)
        write_entity_vectors([pk for pk, _, _ in batch], vectors, model=embedder.model_name)
        done += len(batch)
        last = batch[-1][0]
    return done


# --- chunk headers -------------------------------------------------------------------------------


def refresh_headers(*, collection: str | None = None, apply: bool = False) -> dict[str, int]:
    """Bring stored chunks' headers in line with ``CHUNK_HEADERS``, which changes new chunks
    only: on, each chunk gets the header ingest would give it now (its document's title and,
    for a format parsed as Markdown, its heading path); off, headers are taken away.

    Returns ``{"documents": n, "chunks": m}``: those whose header differs (a dry run), or,
    with ``apply``, those changed. A changed chunk is re-indexed for full-text search and
    re-embedded with the current embedder, its document's row locked meanwhile, so a document
    is never left half done and a second run finds nothing. A document replaced or deleted
    during the run is skipped (a new version got its headers at ingest). A header a custom
    chunker set is rebuilt like any other: with such a chunker, re-ingest instead.
    """
    if configured_embedder("NEXT_EMBEDDER") is not None:
        raise InvalidInput(
            "A model switch is under way (NEXT_EMBEDDER is set): finish it with rag_reembed "
            "before refreshing chunk headers."
        )
    db = write_db()
    documents = Document.objects.using(db).filter(status=Document.Status.COMPLETED)
    if collection is not None:
        if not Collection.objects.using(db).filter(name=collection).exists():
            raise UnknownCollection(collection)
        documents = documents.filter(collection__name=collection)
    formats = parser_formats()
    embedder = get_embedder() if apply else None
    counts = {"documents": 0, "chunks": 0}
    ids = documents.order_by("pk").values_list("pk", flat=True)
    with span("refresh_headers", collection=collection, apply=apply) as s:
        for document_id in ids.iterator(chunk_size=500):
            if apply:
                changed = _apply_headers(document_id, formats, embedder, db)
            else:
                changed = len(_header_changes(document_id, formats, db))
            if changed:
                counts["documents"] += 1
                counts["chunks"] += changed
        s.set(**counts)
    return counts


def _header_changes(document_id: int, formats: dict[str, str], db: str) -> dict[int, str]:
    """``{chunk id: header it should have ("" for none)}`` for this document's chunks whose
    stored header differs (nothing when the document is gone or not completed)."""
    document = (
        Document.objects.using(db)
        .filter(pk=document_id, status=Document.Status.COMPLETED)
        .only("title", "content", "content_type")
        .first()
    )
    if document is None:
        return {}
    rows = list(
        Chunk.objects.using(db)
        .filter(document_id=document_id)
        .order_by("chunk_index")
        .values_list("pk", "start_char", "metadata")
    )
    if headers_enabled():
        wanted = chunk_headers(
            [start for _, start, _ in rows],
            title=document.title,
            text=document.content,
            format=formats.get(document.content_type.split(";")[0].strip().lower(), "text"),
        )
    else:
        wanted = [""] * len(rows)
    return {
        pk: header
        for (pk, _, metadata), header in zip(rows, wanted, strict=True)
        if header_of(metadata) != header
    }


def _apply_headers(document_id: int, formats: dict[str, str], embedder, db: str) -> int:
    """Write one document's changed headers, its full-text vectors and its changed chunks'
    embeddings in one transaction, under its row lock. Returns the chunks changed."""
    with transaction.atomic(using=db):
        # Ingest replaces a document by writing a new one and deleting this one: once the
        # lock is held, the chunks read below stay this version's until the commit.
        if not Document.objects.using(db).select_for_update().filter(pk=document_id).exists():
            return 0
        changes = _header_changes(document_id, formats, db)
        if not changes:
            return 0
        chunks = list(Chunk.objects.using(db).filter(pk__in=changes).only("pk", "text", "metadata"))
        for chunk in chunks:
            metadata = {k: v for k, v in (chunk.metadata or {}).items() if k != HEADER_KEY}
            if changes[chunk.pk]:
                metadata[HEADER_KEY] = changes[chunk.pk]
            chunk.metadata = metadata
        Chunk.objects.using(db).bulk_update(chunks, ["metadata"])
        index_chunks(document_id=document_id, using=db)
        texts = [with_header(chunk.text, changes[chunk.pk]) for chunk in chunks]
        vectors = _embed(embedder, texts, embedding_dimensions())
        schema.write_vectors([chunk.pk for chunk in chunks], vectors, embedder.model_name)
    return len(chunks)


# --- orphans -------------------------------------------------------------------------------------


def find_orphans() -> dict[str, int]:
    """Count rows without a consistent parent, and a shadow column left by an abandoned
    model switch (``stale_shadow_column``: 1 when present with no switch running)."""
    found = schema.count_orphans()
    running = Job.objects.filter(kind=SWITCH, status=Job.Status.RUNNING).exists()
    found["stale_shadow_column"] = int(schema.shadow_dimensions() is not None and not running)
    return found


def remove_orphans() -> dict[str, int]:
    """Delete what :func:`find_orphans` finds, in one transaction; returns what was removed."""
    removed = find_orphans()
    schema.delete_orphans(drop_shadow=bool(removed["stale_shadow_column"]))
    return removed


# --- the HNSW index's type ----------------------------------------------------------------------


def vector_index(*, apply: bool = False) -> dict[str, Any]:
    """The chunk vectors' HNSW index against ``VECTOR_INDEX_TYPE``: ``configured``, ``index``
    (what the database has: ``"vector"``, ``"halfvec(n)"``, or None), ``dimensions`` (the
    column's), ``matches``; with ``apply``, an index that does not match is rebuilt of the
    configured type (concurrently: searches go on meanwhile) and ``rebuilt`` says so."""
    state = schema.index_state()
    state["rebuilt"] = False
    if apply and not state["matches"]:
        with span("vector_index", configured=state["configured"], previous=state["index"]):
            schema.rebuild_index()
        state = {**schema.index_state(), "rebuilt": True}
    return state


# --- the BM25 index's statistics ----------------------------------------------------------------


def fulltext_index(*, apply: bool = False) -> dict[str, Any]:
    """The full-text statistics against the live chunks, in the database the store writes:
    ``backend`` (``"sql"`` or ``"pg_textsearch"``), ``chunks`` (live), ``counted`` (the rows
    the pg_textsearch index ranks with, dead ones included; None on the SQL backend, whose
    statistics are the live rows at every commit, or when the extension does not say),
    ``stale`` (counted differs from chunks); with ``apply``, a stale index is rebuilt
    (``REINDEX``: writes to the chunk table wait meanwhile) and ``rebuilt`` says so."""
    db = write_db()
    backend = fulltext_backend(db)

    def read() -> dict[str, Any]:
        chunks = Chunk.objects.using(db).count()
        counted = textsearch.counted_rows(db) if backend == "pg_textsearch" else None
        stale = backend == "pg_textsearch" and counted != chunks
        return {"backend": backend, "chunks": chunks, "counted": counted, "stale": stale}

    state = {**read(), "rebuilt": False}
    if apply and state["stale"]:
        with span("fulltext_index", counted=state["counted"], chunks=state["chunks"]):
            textsearch.rebuild_index(db)
        state = {**read(), "rebuilt": True}
    return state


# --- info ----------------------------------------------------------------------------------------


def embedding_config() -> dict[str, Any]:
    """The embedding configuration: ``model`` and ``dimensions`` of the configured embedder,
    ``column_dimensions`` (``EMBEDDING_DIMENSIONS``) and ``vector_index`` (see
    :func:`vector_index`: the configured type, the index the database has, whether they match).
    """
    embedder = get_embedder()
    return {
        "model": embedder.model_name,
        "dimensions": embedder.dimensions,
        "column_dimensions": get_setting("EMBEDDING_DIMENSIONS"),
        "vector_index": schema.index_state(),
    }


def _describe(build: Callable[[], Any]) -> dict[str, Any]:
    """What a configured component is: ``label`` (its class and model, secrets scrubbed), or
    ``problem`` (why it cannot be built); ``configured`` False when the setting is None."""
    try:
        component = build()
    except Exception as exc:  # a bad spec or a missing backend: say so, never raise from info
        problem = scrub_text(f"{type(exc).__name__}: {exc}")[:500]
        return {"configured": True, "label": None, "problem": problem}
    if component is None:
        return {"configured": False, "label": None, "problem": None}
    model = getattr(component, "model_name", None) or getattr(component, "model", None)
    label = type(component).__name__ + (f" ({model})" if isinstance(model, str) and model else "")
    return {"configured": True, "label": scrub_text(label), "problem": None}


#: The Loop options whose defaults :func:`components` reports.
LOOP_OPTIONS = (
    "max_iterations",
    "limit",
    "max_limit",
    "max_chunks",
    "max_tool_calls",
    "max_tool_result_chars",
    "keep_sources",
    "fallback_synthesis",
)


def components() -> dict[str, Any]:
    """The reranker (``RERANKER``), the grounder (``GROUNDER``) and the :class:`~django_rag.Loop`
    (its defaults: the ``LOOP`` setting, and ``AGENT_DEADLINE``), as :func:`info` shows
    them. Building a component loads no model (components load lazily)."""
    return {
        "reranker": _describe(get_reranker),
        "grounder": _describe(lambda: get_grounder() if get_setting("GROUNDER") else None),
        "loop": {
            **call_defaults("LOOP", **dict.fromkeys(LOOP_OPTIONS)),
            "deadline": get_setting("AGENT_DEADLINE"),
        },
    }


def info() -> dict[str, Any]:
    """Configuration (secrets redacted), the active embedder, pgvector, counts per collection,
    the reranker, grounder and Loop (:func:`components`)."""
    embedding = embedding_config()
    collections = [
        {
            "name": c.name,
            "documents": c.documents.count(),
            "chunks": Chunk.objects.filter(collection=c).count(),
        }
        for c in Collection.objects.all()
    ]
    return {
        "settings": redact(get_settings()),
        "embedder": {"model": embedding["model"], "dimensions": embedding["dimensions"]},
        "embedding_dimensions": embedding["column_dimensions"],
        "vector_index": embedding["vector_index"],
        # "0.8.5" as people write it (a tuple printed "(0, 8, 5)").
        "pgvector": ".".join(map(str, pgvector_version())) or "not installed",
        "collections": collections,
        "chunks_by_model": dict(_chunks_by_model()),
        "background": {**background.describe(), "stalled_jobs": background.stalled().count()},
        **components(),
    }


def _chunks_by_model() -> list[tuple[str, int]]:
    from django.db.models import Count

    return list(
        Chunk.objects.values("embedding_model")
        .annotate(n=Count("id"))
        .values_list("embedding_model", "n")
    )


def prune_jobs(*, older_than_days: float = 30, apply: bool = False) -> dict[str, int]:
    """Finished jobs (completed, superseded, failed) that ended more than ``older_than_days``
    ago, by kind: counted, and deleted with ``apply``. Model sync queues a job per saved row,
    so the table grows with a site's edits; the jobs of resumable commands and unfinished
    work are never touched."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    finished = Job.objects.filter(
        status__in=[Job.Status.COMPLETED, Job.Status.SUPERSEDED, Job.Status.FAILED],
        finished_at__lt=cutoff,
    )
    counts = {
        row["kind"]: row["n"]
        for row in finished.values("kind").annotate(n=models.Count("pk")).order_by("kind")
    }
    if apply and counts:
        finished.delete()
    return counts

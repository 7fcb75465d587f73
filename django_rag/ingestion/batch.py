"""Batched ingestion: many texts (:func:`ingest_many`) or files (:func:`ingest_files`) embedded
several documents per batch and written one group per transaction, the next group embedded on a
thread while the previous one is written.
"""

from __future__ import annotations

import contextvars
import logging
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Unpack

from django.db import DatabaseError, connections

from ..exceptions import DocumentSuperseded, EmbeddingFailed, InvalidOption, RagError
from ..models import Document
from ..models.databases import write_db
from ..signals import span
from ..store import DocumentWrite, write_documents
from ..store.documents import find_duplicates
from ..store.transactions import compact_on_commit
from .collections import apply_description
from .headers import embedding_inputs
from .pipeline import (
    Pending,
    assemble,
    superseded_result,
    take_versions,
    text_document,
    validate,
)
from .prepare import chunk_text, embed_texts
from .request import IngestOptions, IngestRequest, build_ingest_request

logger = logging.getLogger(__name__)

# Batched ingestion folds the BM25 statistics deltas about this often (in chunks).
COMPACT_EVERY = 2048
_ITEM_KEYS = {"text", "title", "metadata", "source_id", "format"}


def ingest_many(
    documents: Iterable[str | dict], **options: Unpack[IngestOptions]
) -> list[Document | Exception]:
    """Ingest many texts, embedding the chunks of several documents per batch.

    Each item is a string or a dict with ``text`` and optionally ``title``, ``metadata``,
    ``source_id`` and ``format``; the options (``collection``, ``replace``, ``format``,
    ``chunker``, ``embedder``, ``chunk_size``, ``chunk_overlap``, ``graph`` and the extractors,
    ``strict_collections``, ``group_size`` (64), ``on_error`` ("skip")) apply to every item as
    in :func:`~django_rag.ingestion.service.ingest`. Returns the documents in input order
    (stored duplicates included, as with ``ingest``).

    One bad document does not fail the batch: with ``on_error="skip"`` (the default, as for
    :func:`ingest_files` and ``rag_ingest``) a document that cannot be ingested (empty text,
    bad metadata or source id, a chunk the embedder refuses, a failed write) is skipped and its
    exception (a :class:`~django_rag.exceptions.RagError` with a note naming ``documents[i]``)
    takes its place in the result; the others are stored. Options wrong for every document
    (``collection``, ``format``, ``chunk_size``...) still raise before anything is stored.

    With ``on_error="raise"`` every item is validated and chunked before anything is embedded
    or written, so bad input raises with nothing stored (the error has a note naming
    ``documents[i]``); if the embedder fails, the documents of earlier groups stay stored and
    :class:`~django_rag.exceptions.EmbeddingFailed` names the document and chunk; if a group's
    write fails, the error is raised: earlier groups stay stored, and so do the earlier runs of
    the failing group when it was cut at a repeated source_id.

    Stored duplicates are found in one query. Documents are embedded ``group_size`` at a time
    (the next group on a thread while the previous one is written) and each group is written
    in one transaction, in order (cut where a source_id comes back, so the result is that of
    one ``ingest`` per document).
    """
    request = build_ingest_request("ingest_many", options)
    collection = request.collection_name
    with span("ingest_many", collection=collection, group_size=request.group_size) as s:
        results = _ingest_many(documents, request)
        apply_description(collection, request.collection.description)  # the options passed
        failed = sum(isinstance(document, Exception) for document in results)
        if failed:
            logger.warning("ingest_many: %d of %d document(s) skipped", failed, len(results))
        s.set(
            document_count=len(results) - failed,
            failed=failed,
            chunk_count=sum(getattr(document, "chunk_count", 0) for document in results),
        )
        return results


def _ingest_many(documents, request: IngestRequest) -> list:
    errors: dict[int, Exception] | None = {} if request.on_error == "skip" else None
    results: list = []
    validated: list[tuple[int, Pending]] = []
    for index, item in enumerate(documents):
        try:
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict) or "text" not in item or set(item) - _ITEM_KEYS:
                raise InvalidOption(
                    "each document must be a str or a dict with 'text' and optionally "
                    f"{', '.join(sorted(_ITEM_KEYS - {'text'}))}"
                )
            parsed = text_document(item["text"], item.get("format", request.format))
            checked = validate(
                parsed,
                collection=request.collection_name,
                title=item.get("title", ""),
                metadata=item.get("metadata"),
                source_id=item.get("source_id"),
                replace=request.replace,
                check_duplicate=False,
            )
        except RagError as exc:
            exc.add_note(f"in documents[{index}]")
            if errors is None:
                raise
            errors[index] = exc
            results.append(exc)
            continue
        validated.append((index, checked))
        results.append(checked)
    take_versions([item for _, item in validated])
    to_write = without_stored(validated, results, request.replace)
    write_batched(to_write, results, request, errors=errors)
    for index, error in (errors or {}).items():
        if not any(note.startswith("in documents[") for note in getattr(error, "__notes__", [])):
            error.add_note(f"in documents[{index}]")
        results[index] = error
    return results


def without_stored(validated: list[tuple[int, Pending]], results: list, replace: bool) -> list:
    """Cheap dedup before any embedding work, one query per thousand documents (the store
    checks again under the identity locks): a stored duplicate goes to ``results[index]``,
    the others are returned. With ``replace``, only a duplicate that is its identity's only
    document counts (one more query)."""
    stored: dict = {}
    if validated:
        name = validated[0][1].collection
        identities = [(p.document.source_id, p.document.content_hash) for _, p in validated]
        for start in range(0, len(identities), 1000):
            stored.update(find_duplicates(name, identities[start : start + 1000]))
    if replace and stored:
        # A replace whose text is already its identity's only document has nothing to replace:
        # it is not embedded again (re-running rag_ingest on unchanged files costs no model
        # time). Where other versions are stored, the write goes on and deletes them.
        sources = sorted({source for source, _ in stored})
        versions = Counter(
            Document.objects.using(write_db())
            .filter(collection__name=validated[0][1].collection, source_id__in=sources)
            .values_list("source_id", flat=True)
        )
        stored = {key: document for key, document in stored.items() if versions[key[0]] == 1}
    left = []
    for index, item in validated:
        existing = stored.get((item.document.source_id, item.document.content_hash))
        if existing is not None:
            existing.deduplicated = True
            results[index] = existing
        else:
            left.append((index, item))
    return left


def record_failure(errors: dict[int, Exception] | None, index: int, exc: Exception) -> None:
    """Record ``exc`` as ``documents[index]``'s failure in ``errors``, or, when failures are
    not recorded (``errors`` None), raise it with a note naming the document."""
    if errors is None:
        exc.add_note(f"in documents[{index}]")
        raise exc
    errors[index] = exc


def write_batched(
    items: list[tuple[int, Pending]],
    results: list,
    request: IngestRequest,
    *,
    errors: dict[int, Exception] | None = None,
) -> None:
    """Chunk, embed and write validated documents ``group_size`` at a time; ``results[index]``
    becomes each one's stored document.

    Without ``errors`` the first failure raises (with a note naming ``documents[index]``);
    with it, a document's failure is recorded there and the others go on (a group whose
    embedding fails is embedded again document by document). ``progress(done, total)`` is
    called with chunk counts as batches are embedded (from the embedding thread)."""
    embedder, graph, progress = request.embedder, request.graph, request.progress
    group_size = request.group_size
    pending: list[tuple[int, Pending]] = []
    for index, item in items:
        try:
            item.chunks = chunk_text(
                item.parsed, chunker=request.chunker, embedder=embedder, title=item.document.title
            )
        except RagError as exc:
            record_failure(errors, index, exc)
            continue
        pending.append((index, item))
    groups = [pending[start : start + group_size] for start in range(0, len(pending), group_size)]
    if not groups:
        return
    total = sum(len(item.chunks) for _, item in pending)
    done = 0

    def embed(group) -> list:
        texts = [text for _, item in group for text in embedding_inputs(item.chunks)]
        before = done  # groups are embedded one after another

        def advance(count: int, _of: int) -> None:
            nonlocal done
            done = before + count
            progress(done, total)

        try:
            return embed_texts(embedder, texts, progress=advance if progress else None)
        finally:
            # A progress callback (a job's report) may have used the database on this thread.
            connections.close_all()

    # The statistics deltas are folded every COMPACT_EVERY chunks and at the end (even after a
    # failure), not after every group.
    since_compaction = 0
    try:
        # The next group is embedded on a thread while this one is written: the model and the
        # database work at the same time (the model releases the GIL while it computes).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="django_rag-embed") as pool:
            future = pool.submit(contextvars.copy_context().run, embed, groups[0])
            for number, group in enumerate(groups):
                try:
                    vectors = future.result()
                except EmbeddingFailed as exc:
                    if errors is None:
                        raise _group_failure(exc, group) from exc.__cause__
                    vectors = None
                if number + 1 < len(groups):
                    future = pool.submit(contextvars.copy_context().run, embed, groups[number + 1])
                writes, written_indexes, offset = [], [], 0
                for index, item in group:
                    count = len(item.chunks)
                    try:
                        if vectors is None:  # the group failed: find which document did
                            own = embed_texts(embedder, embedding_inputs(item.chunks))
                        else:
                            own = vectors[offset : offset + count]
                        prepared = assemble(
                            item, item.chunks, own, embedder, graph, None, request.graph_store
                        )
                    except RagError as exc:
                        record_failure(errors, index, exc)
                        continue
                    finally:
                        offset += count
                    item.document.error = ""
                    writes.append(
                        DocumentWrite(
                            item.document,
                            [chunk.row() for chunk in prepared.chunks],
                            replace=item.replace,
                            extractions=prepared.extractions,
                        )
                    )
                    written_indexes.append(index)
                if not writes:
                    continue
                written = _write_group(
                    writes,
                    written_indexes,
                    errors,
                    collection=group[0][1].collection,
                    model_name=embedder.model_name,
                )
                since_compaction += sum(len(write.chunks) for write in writes)
                if since_compaction >= COMPACT_EVERY:
                    compact_on_commit()
                    since_compaction = 0
                for index, document in zip(written_indexes, written, strict=True):
                    if document is None:  # its write failed: recorded in ``errors``
                        continue
                    if isinstance(document, DocumentSuperseded):  # a newer version won
                        results[index] = superseded_result(dict(group)[index], document)
                        continue
                    document.skipped_chunks = []
                    results[index] = document
    finally:
        if since_compaction:
            try:
                compact_on_commit()
            except Exception:  # the deltas stay for the next compaction; keep the real error
                logger.exception("folding the statistics deltas after a batched ingest failed")


def _write_group(
    writes: list[DocumentWrite],
    indexes: list[int],
    errors: dict[int, Exception] | None,
    *,
    collection: str,
    model_name: str,
) -> list[Document | None]:
    """Write a group in one transaction. When recording ``errors`` (one file's failure must not
    stop the others) and the group's write fails, its documents are written one by one, so only
    the failing ones are lost; each failure is recorded under its index (None in the result)."""
    try:
        return write_documents(writes, collection=collection, model_name=model_name, compact=False)
    except (RagError, DatabaseError):
        if errors is None or connections[write_db()].in_atomic_block:
            raise
    written: list[Document | None] = []
    for index, write in zip(indexes, writes, strict=True):
        write.document.pk = None  # the failed attempt's keys were rolled back
        write.document._state.adding = True
        try:
            (document,) = write_documents(
                [write], collection=collection, model_name=model_name, compact=False
            )
        except (RagError, DatabaseError) as exc:
            errors[index] = exc
            document = None
        written.append(document)
    return written


def _group_failure(exc: EmbeddingFailed, group) -> EmbeddingFailed:
    """The embedder's failure in a group, naming the document and its chunk."""
    position = exc.chunk_index
    for index, item in group:
        if position < len(item.chunks):
            return EmbeddingFailed(
                f"Embedding documents[{index}] chunk {position} failed: "
                f"{exc.__cause__}. Documents before it in earlier groups were stored; "
                "this one and the rest were not.",
                chunk_index=position,
            )
        position -= len(item.chunks)
    return exc

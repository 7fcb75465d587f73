"""Ingesting many files (what ``rag_ingest`` and folder sync run): each file parsed, then the
documents go through the batched path of :mod:`~django_rag.ingestion.batch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Unpack

from ..exceptions import InvalidOption, RagError
from ..models import Document
from ..signals import span
from ..validation import clean_filename
from .batch import without_stored, write_batched
from .collections import apply_description
from .isolation import parse_file_isolated
from .parsers import ParsedDocument
from .pipeline import Pending, take_versions, validate
from .request import IngestOptions, IngestRequest, build_ingest_request


def ingest_files(
    paths: Iterable[str | Path],
    *,
    source_ids: Sequence[str] | None = None,
    **options: Unpack[IngestOptions],
) -> list:
    """Ingest many files through the batched path of :func:`ingest_many` (what ``rag_ingest``
    runs): parsed one by one in bounded workers reused from file to file (``MAX_PARSE_MEMORY``,
    ``PARSE_TIMEOUT``: :mod:`~django_rag.ingestion.isolation`), stored duplicates found in one
    query, chunks of several files embedded per batch, each group written in one transaction.

    One file's failure does not stop the others: the result has, for each path in order, the
    stored :class:`Document` (``deduplicated`` as with ``ingest``) or the exception
    (:class:`~django_rag.exceptions.RagError` or ``OSError``) that file raised. Options
    (``collection``, ``replace``, ``title``, ``metadata``, ``chunker``, ``embedder``,
    ``chunk_size``, ``chunk_overlap``, ``graph`` and the extractors, ``strict_collections``,
    ``group_size``, ``progress``) are checked once, before any file is read: a wrong one
    raises. ``source_ids`` defaults to each path as given. ``progress(done, total)`` receives
    chunk counts while embedding runs (from the embedding thread).

    With ``replace=True``, a file whose text equals its identity's only stored document is not
    embedded again: that document comes back with ``deduplicated = True``.
    """
    request = build_ingest_request("ingest_files", options)
    paths = [Path(path) for path in paths]
    if source_ids is not None and len(source_ids) != len(paths):
        raise InvalidOption(f"{len(source_ids)} source_ids for {len(paths)} paths")
    parsed: list[ParsedDocument | Exception] = []
    for path in paths:
        try:
            clean_filename(str(path))
            parsed.append(parse_file_isolated(path))
        except (RagError, OSError) as exc:
            parsed.append(exc)
    return ingest_parsed_files(paths, parsed, request, source_ids=source_ids)


def ingest_parsed_files(
    paths: Sequence[Path],
    parsed: Sequence[ParsedDocument | Exception],
    request: IngestRequest,
    *,
    source_ids: Sequence[str] | None = None,
) -> list:
    """:func:`ingest_files` for files already parsed (``parsed[i]`` is ``paths[i]``'s
    document, or the exception its parsing raised, returned as is): what
    :func:`~django_rag.ingestion.folders.sync_folder` runs after comparing hashes."""
    name = request.collection_name
    with span("ingest_files", collection=name, file_count=len(paths)) as s:
        results: list = [None] * len(paths)
        errors: dict[int, Exception] = {}
        validated: list[tuple[int, Pending]] = []
        for index, (path, document) in enumerate(zip(paths, parsed, strict=True)):
            if isinstance(document, Exception):
                errors[index] = document
                continue
            try:
                validated.append(
                    (
                        index,
                        validate(
                            document,
                            collection=name,
                            title=request.title,
                            metadata=request.metadata,
                            source_id=source_ids[index] if source_ids is not None else str(path),
                            replace=request.replace,
                            filename=path.name,
                            check_duplicate=False,
                        ),
                    )
                )
            except (RagError, OSError) as exc:
                errors[index] = exc
        if validated:
            apply_description(name, request.collection.description)
        take_versions([item for _, item in validated])
        write_batched(
            without_stored(validated, results, request.replace), results, request, errors=errors
        )
        for index, error in errors.items():
            results[index] = error
        s.set(document_count=sum(isinstance(r, Document) for r in results), failed=len(errors))
        return results

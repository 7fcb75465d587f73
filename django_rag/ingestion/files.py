"""Ingesting many files (what ``rag_ingest`` and folder sync run): each file parsed, then the
documents go through the batched path of :mod:`~django_rag.ingestion.batch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ..embeddings import Embedder, get_embedder
from ..exceptions import InvalidOption, RagError
from ..models import Document
from ..signals import span
from ..validation import clean_collection_name, clean_filename, clean_metadata, clean_title
from .batch import without_stored, write_batched
from .chunkers import get_chunker
from .graphs import use_graph
from .isolation import parse_file_isolated
from .parsers import ParsedDocument
from .pipeline import Pending, take_versions, validate


def ingest_files(
    paths: Iterable[str | Path],
    *,
    collection: str | None = None,
    source_ids: Sequence[str] | None = None,
    replace: bool = False,
    title: str = "",
    metadata: dict | None = None,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    group_size: int = 64,
    graph: bool | None = None,
    progress=None,
) -> list:
    """Ingest many files through the batched path of :func:`ingest_many` (what ``rag_ingest``
    runs): parsed one by one in bounded workers reused from file to file (``MAX_PARSE_MEMORY``,
    ``PARSE_TIMEOUT``: :mod:`~django_rag.ingestion.isolation`), stored duplicates found in one query, chunks of several files
    embedded per batch, each group written in one transaction.

    One file's failure does not stop the others: the result has, for each path in order, the
    stored :class:`Document` (``deduplicated`` as with ``ingest``) or the exception
    (:class:`~django_rag.exceptions.RagError` or ``OSError``) that file raised. Options that are
    wrong for every file (``collection``, ``metadata``, ``chunk_size``...) raise at once.
    ``source_ids`` defaults to each path as given. ``progress(done, total)`` receives chunk
    counts while embedding runs (from the embedding thread).

    With ``replace=True``, a file whose text equals its identity's only stored document is not
    embedded again: that document comes back with ``deduplicated = True``.
    """
    paths = [Path(path) for path in paths]
    if source_ids is not None and len(source_ids) != len(paths):
        raise InvalidOption(f"{len(source_ids)} source_ids for {len(paths)} paths")
    name, resolved = _check_file_options(
        collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
    )
    parsed: list[ParsedDocument | Exception] = []
    for path in paths:
        try:
            clean_filename(str(path))
            parsed.append(parse_file_isolated(path))
        except (RagError, OSError) as exc:
            parsed.append(exc)
    return ingest_parsed_files(
        paths,
        parsed,
        collection=name,
        source_ids=source_ids,
        replace=replace,
        title=title,
        metadata=metadata,
        chunker=chunker,
        embedder=resolved,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        group_size=group_size,
        graph=graph,
        progress=progress,
    )


def _check_file_options(
    collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
) -> tuple[str, Embedder]:
    """Options shared by every file, checked once, before any file is read."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidOption(f"group_size must be a positive integer, got {group_size!r}")
    name = clean_collection_name(collection)
    clean_title(title)
    clean_metadata(metadata)
    options = {
        key: value
        for key, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap))
        if value is not None
    }
    get_chunker(chunker, **options)
    return name, get_embedder(embedder)


def ingest_parsed_files(
    paths: Sequence[Path],
    parsed: Sequence[ParsedDocument | Exception],
    *,
    collection: str | None = None,
    source_ids: Sequence[str] | None = None,
    replace: bool = False,
    title: str = "",
    metadata: dict | None = None,
    chunker=None,
    embedder=None,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    group_size: int = 64,
    graph: bool | None = None,
    progress=None,
) -> list:
    """:func:`ingest_files` for files already parsed (``parsed[i]`` is ``paths[i]``'s
    document, or the exception its parsing raised, returned as is): what
    :func:`~django_rag.ingestion.folders.sync_folder` runs after comparing hashes."""
    name, resolved = _check_file_options(
        collection, title, metadata, chunker, embedder, chunk_size, chunk_overlap, group_size
    )
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
                            title=title,
                            metadata=metadata,
                            source_id=source_ids[index] if source_ids is not None else str(path),
                            replace=replace,
                            filename=path.name,
                            check_duplicate=False,
                        ),
                    )
                )
            except (RagError, OSError) as exc:
                errors[index] = exc
        take_versions([item for _, item in validated])
        write_batched(
            without_stored(validated, results, replace),
            results,
            embedder=resolved,
            chunker=chunker,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            group_size=group_size,
            graph=use_graph(graph),
            errors=errors,
            progress=progress,
        )
        for index, error in errors.items():
            results[index] = error
        s.set(document_count=sum(isinstance(r, Document) for r in results), failed=len(errors))
        return results

"""Vector stores: where semantic search runs.

``PgVectorStore`` searches the ``Chunk`` table. ``MemoryVectorStore`` keeps vectors in process
(exact cosine over numpy) for tests and small apps; it has the same search API.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..conf import build_component, get_setting, on_reset
from ..exceptions import UnknownCollection
from .results import SearchResult


class VectorStore:
    """Base class: semantic search over stored chunk vectors."""

    def search(
        self,
        vector: Sequence[float],
        *,
        limit: int,
        threshold: float | None = None,
        collections: Sequence[str] | None = None,
        source_id: str | None = None,
    ) -> list[SearchResult]:
        """Nearest chunks to ``vector``; ``collections`` None means every collection.

        An unknown collection name raises :class:`~django_rag.exceptions.UnknownCollection`.
        """
        raise NotImplementedError


class PgVectorStore(VectorStore):
    def search(self, vector, *, limit, threshold=None, collections=None, source_id=None):
        from ..models import Chunk, Collection

        chunks = Chunk.objects.all()
        if collections is not None:
            ids = dict(Collection.objects.filter(name__in=collections).values_list("name", "pk"))
            for name in collections:
                if name not in ids:
                    raise UnknownCollection(name)
            chunks = chunks.filter(collection_id__in=list(ids.values()))
        if source_id:
            chunks = chunks.filter(document__source_id=source_id)
        rows = chunks.semantic(vector, limit=limit, threshold=threshold)
        return [SearchResult.from_chunk(row) for row in rows]


class MemoryVectorStore(VectorStore):
    """An in-process store with exact cosine search.

    Fill it with :meth:`ingest` (chunks and embeds like the database path) or :meth:`add`.
    """

    def __init__(self):
        # One SearchResult per chunk (score 0); a search returns scored copies.
        self._entries: list[SearchResult] = []
        self._vectors: list[np.ndarray] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._documents = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        vector: Sequence[float],
        *,
        text: str,
        collection: str = "default",
        source_id: str = "",
        **fields: Any,
    ) -> int:
        """Store one chunk; ``fields`` are other :class:`SearchResult` fields (metadata...)."""
        array = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(array))
        with self._lock:
            if self._vectors and array.shape != self._vectors[0].shape:
                raise ValueError(
                    f"vector has {array.shape[0]} dimensions; this store holds {self._vectors[0].shape[0]}"
                )
            entry = SearchResult(
                chunk_id=next(self._ids),
                text=text,
                score=0.0,
                collection=collection,
                source_id=source_id,
                **fields,
            )
            self._entries.append(entry)
            self._vectors.append(array / norm if norm else array)
        return entry.chunk_id

    def ingest(
        self,
        text: str,
        *,
        collection: str = "default",
        source_id: str = "",
        title: str = "",
        metadata: dict | None = None,
        format: str = "text",
        chunker=None,
        embedder=None,
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
    ) -> list[int]:
        """Chunk and embed ``text`` exactly as database ingest does; returns the chunk ids."""
        from ..embeddings import get_embedder
        from ..ingestion.parsers import ParsedDocument
        from ..ingestion.service import clean_metadata, clean_text, prepare_chunks

        parsed = ParsedDocument(text=clean_text(text), format=format)
        prepared = prepare_chunks(
            parsed,
            chunker=chunker,
            embedder=get_embedder(embedder),
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
        )
        document_id = next(self._documents)
        metadata = clean_metadata(metadata)
        return [
            self.add(
                item.embedding,
                text=item.chunk.text,
                collection=collection,
                source_id=source_id,
                document_id=document_id,
                chunk_index=item.chunk_index,
                metadata={**metadata, **item.chunk.metadata},
                title=title,
                start_char=item.chunk.start,
                end_char=item.chunk.end,
            )
            for item in prepared
        ]

    def delete(self, *, collection: str | None = None, source_id: str | None = None) -> int:
        """Remove entries matching the filters; returns how many were removed."""
        with self._lock:
            keep = [
                i
                for i, e in enumerate(self._entries)
                if not (
                    (collection is None or e.collection == collection)
                    and (source_id is None or e.source_id == source_id)
                )
            ]
            removed = len(self._entries) - len(keep)
            self._entries = [self._entries[i] for i in keep]
            self._vectors = [self._vectors[i] for i in keep]
        return removed

    def search(self, vector, *, limit, threshold=None, collections=None, source_id=None):
        with self._lock:
            entries, vectors = list(self._entries), list(self._vectors)
        if collections is not None:
            known = {e.collection for e in entries}
            for name in collections:
                if name not in known:
                    raise UnknownCollection(name)
        selected = [
            i
            for i, e in enumerate(entries)
            if (collections is None or e.collection in collections)
            and (not source_id or e.source_id == source_id)
        ]
        if not selected:
            return []
        query = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(query))
        query = query / norm if norm else query
        scores = np.stack([vectors[i] for i in selected]) @ query
        # Stable order: best score first, then insertion order (like the database's pk order).
        order = sorted(range(len(selected)), key=lambda j: (-float(scores[j]), selected[j]))
        results = []
        for j in order[:limit]:
            score = float(scores[j])
            if threshold is not None and score < threshold:
                break
            entry = entries[selected[j]]
            results.append(
                replace(entry, score=score, semantic_score=score, metadata=dict(entry.metadata))
            )
        return results


ALIASES = {
    "pgvector": "django_rag.retrieval.stores.PgVectorStore",
    "memory": "django_rag.retrieval.stores.MemoryVectorStore",
}


_default: list[VectorStore] = []


def get_vector_store(spec: Any = None) -> VectorStore:
    """The store for ``spec``, or the configured one (built once, so a memory store persists)."""
    if spec is not None:
        return build_component(spec, setting="VECTOR_STORE", base=VectorStore, aliases=ALIASES)
    if not _default:
        _default.append(get_vector_store(get_setting("VECTOR_STORE")))
    return _default[0]


on_reset(_default.clear)

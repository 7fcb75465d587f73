"""Vector stores: where semantic search runs.

``PgVectorStore`` searches the ``Chunk`` table. ``MemoryVectorStore`` keeps vectors in process
(exact cosine over numpy) for tests and small apps; it has the same search API.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..conf import build_component, get_setting, on_reset, search_setting
from ..exceptions import UnknownCollection
from ..results import SearchResult
from .fulltext import split_query
from .fusion import fuse


class VectorStore:
    """Base class: answers a :class:`~django_rag.retrieval.service.SearchRequest`.

    ``request.mode`` is ``semantic``, ``fulltext`` or ``hybrid``; ``request.vector`` is the
    query embedding (semantic and hybrid). An unknown collection name raises
    :class:`~django_rag.exceptions.UnknownCollection`.
    """

    def search(self, request) -> list[SearchResult]:
        raise NotImplementedError


def scoped_chunks(request):
    """The chunks a request may return: its collections (an unknown name raises
    :class:`UnknownCollection`), source and metadata filters. Used by every search path."""
    from ..models import Chunk, Collection

    chunks = Chunk.objects.all()
    if request.collections is not None:
        ids = dict(
            Collection.objects.filter(name__in=request.collections).values_list("name", "pk")
        )
        for name in request.collections:
            if name not in ids:
                raise UnknownCollection(name)
        chunks = chunks.filter(collection_id__in=list(ids.values()))
    if request.source_id:
        chunks = chunks.filter(document__source_id=request.source_id)
    if request.metadata:
        chunks = chunks.filter(document__metadata__contains=request.metadata)
    return chunks


class PgVectorStore(VectorStore):
    def search(self, request):
        chunks = scoped_chunks(request)
        if request.mode == "semantic":
            rows = chunks.semantic(request.vector, limit=request.limit, threshold=request.threshold)
        elif request.mode == "fulltext":
            rows = chunks.fulltext(request.query, limit=request.limit, threshold=request.threshold)
        else:
            rows = chunks.hybrid(
                request.vector,
                request.query,
                limit=request.limit,
                threshold=request.threshold,
                fusion=request.fusion,
                rrf_k=request.rrf_k,
                semantic_weight=request.semantic_weight,
                fulltext_weight=request.fulltext_weight,
                candidates=request.candidates,
            )
        return [SearchResult.from_chunk(row) for row in rows]


class MemoryVectorStore(VectorStore):
    """An in-process store with exact cosine search.

    Fill it with :meth:`ingest` (chunks and embeds like the database path) or :meth:`add`.
    """

    def __init__(self):
        # One SearchResult per chunk (score 0); a search returns scored copies.
        self._entries: list[SearchResult] = []
        self._vectors: list[np.ndarray] = []
        self._tokens: list[list[str]] = []
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
            self._tokens.append(tokenize(text))
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
            self._tokens = [self._tokens[i] for i in keep]
        return removed

    def search(self, request):
        with self._lock:
            entries, vectors, tokens = list(self._entries), list(self._vectors), list(self._tokens)
        if request.collections is not None:
            known = {e.collection for e in entries}
            for name in request.collections:
                if name not in known:
                    raise UnknownCollection(name)
        selected = [
            i
            for i, e in enumerate(entries)
            if (request.collections is None or e.collection in request.collections)
            and (not request.source_id or e.source_id == request.source_id)
            and (not request.metadata or contains(e.metadata, request.metadata))
        ]
        results = {
            i: replace(entries[i], score=0.0, metadata=dict(entries[i].metadata)) for i in selected
        }
        if request.mode != "fulltext" and selected:
            query = np.asarray(request.vector, dtype=np.float32)
            norm = float(np.linalg.norm(query))
            similarities = np.stack([vectors[i] for i in selected]) @ (
                query / norm if norm else query
            )
            for i, similarity in zip(selected, similarities, strict=True):
                results[i].semantic_score = float(similarity)
        matches: dict[int, float] = {}
        if request.mode != "semantic":
            matches, excluded = bm25_scores(tokens, request.query)
            for i in excluded:
                results.pop(i, None)
            for i, result in results.items():
                result.fulltext_score = matches.get(i, 0.0)
        if request.mode == "semantic":
            ranked = sorted(results.values(), key=lambda r: -r.semantic_score)
            for result in ranked:
                result.score = result.semantic_score
        elif request.mode == "fulltext":
            ranked = sorted(
                (r for i, r in results.items() if i in matches), key=lambda r: -r.fulltext_score
            )
            for result in ranked:
                result.score = result.fulltext_score
        else:
            pool = request.limit * request.candidates
            by_semantic = sorted(results.values(), key=lambda r: -r.semantic_score)[:pool]
            by_fulltext = sorted(
                (r for i, r in results.items() if i in matches), key=lambda r: -r.fulltext_score
            )[:pool]
            union = {r.chunk_id: r for r in [*by_semantic, *by_fulltext]}
            ranked = fuse(
                list(union.values()),
                fusion=request.fusion,
                rrf_k=request.rrf_k,
                semantic_weight=request.semantic_weight,
                fulltext_weight=request.fulltext_weight,
            )
        if request.threshold is not None:
            ranked = [r for r in ranked if r.score >= request.threshold]
        return ranked[: request.limit]


# --- in-memory full-text ------------------------------------------------------------------------

# A short English stop list (PostgreSQL's english configuration drops these too).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased words without stop words (no stemming)."""
    return [word for word in _WORD.findall(text.lower()) if word not in STOP_WORDS]


def bm25_scores(
    documents: Sequence[Sequence[str]], query: str
) -> tuple[dict[int, float], set[int]]:
    """BM25 of every tokenised document matching ``query`` (web-search syntax, as in
    PostgreSQL full-text mode), and the indexes of documents an ``-excluded`` word removes."""
    free, phrases, excluded_words = split_query(query)
    phrase_tokens = [t for t in (tokenize(p) for p in phrases) if t]
    terms = set(tokenize(" ".join(free))) | {t for p in phrase_tokens for t in p}
    banned = set(tokenize(" ".join(excluded_words)))
    if not terms or not documents:
        return {}, set()
    k1 = float(search_setting("BM25_K1"))
    b = float(search_setting("BM25_B"))
    total = len(documents)
    average = max(sum(len(d) for d in documents) / total, 1.0)
    frequency = Counter(t for d in documents for t in set(d) & terms)
    scores: dict[int, float] = {}
    excluded: set[int] = set()
    for index, document in enumerate(documents):
        if banned and banned & set(document):
            excluded.add(index)
            continue
        if phrase_tokens and not all(_has_phrase(document, p) for p in phrase_tokens):
            continue
        counts = Counter(t for t in document if t in terms)
        if not counts:
            continue
        scores[index] = sum(
            math.log(1 + (total - frequency[t] + 0.5) / (frequency[t] + 0.5))
            * tf
            * (k1 + 1)
            / (tf + k1 * (1 - b + b * len(document) / average))
            for t, tf in counts.items()
        )
    return scores, excluded


def _has_phrase(document: Sequence[str], phrase: Sequence[str]) -> bool:
    n = len(phrase)
    return any(list(document[i : i + n]) == list(phrase) for i in range(len(document) - n + 1))


def contains(haystack: Any, needle: Any) -> bool:
    """JSON containment as PostgreSQL's ``jsonb @>`` defines it."""
    if isinstance(needle, dict):
        return isinstance(haystack, dict) and all(
            key in haystack and contains(haystack[key], value) for key, value in needle.items()
        )
    if isinstance(needle, list):
        return isinstance(haystack, list) and all(
            any(contains(item, wanted) for item in haystack) for wanted in needle
        )
    return haystack == needle


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

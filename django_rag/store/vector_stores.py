"""Vector stores: where semantic, full-text and hybrid search run, and what receives writes.

PostgreSQL is the system of record: every document and chunk is a row, written by
:mod:`django_rag.store.documents`. ``PgVectorStore`` searches those rows. Any other store
(``MemoryVectorStore``, your own) is an index beside them: the write path hands it every chunk
stored, every chunk deleted and every vector re-embedded (``store``, ``delete``, ``clear``)
inside the same transaction, so a search sent to it sees exactly what PostgreSQL holds.
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

from ..conf import bm25_k3, build_component, get_setting, on_reset, search_setting
from ..exceptions import UnknownCollection
from ..models import Chunk, Collection
from ..models.databases import search_budget, search_db, write_db
from ..models.fulltext import query_term_weight, split_query
from ..results import SearchResult
from .search_modes import implementation


class VectorStore:
    """Base class of vector stores.

    ``search(request)`` answers a :class:`~django_rag.retrieval.request.SearchRequest`
    (``request.mode`` is ``semantic``, ``fulltext`` or ``hybrid``; ``request.vector`` is the
    query embedding in semantic and hybrid mode); an unknown collection name raises
    :class:`~django_rag.exceptions.UnknownCollection`.

    A store configured as ``DJANGO_RAG["VECTOR_STORE"]`` also receives every write:
    ``store(chunks, vectors)`` adds or replaces chunks (``SearchResult`` with their PostgreSQL
    ``chunk_id``, one vector each), ``delete(chunk_ids)`` removes them, ``clear(collection)``
    empties a collection (or everything). A store whose writes fail makes the write fail and
    roll back. System check ``django_rag.E007`` refuses a configured store without them.
    """

    #: False for a store that reads the PostgreSQL rows themselves (nothing to hand over).
    receives_writes = True

    def search(self, request) -> list[SearchResult]:
        raise NotImplementedError

    def store(self, chunks: Sequence[SearchResult], vectors: Sequence[Sequence[float]]) -> None:
        raise NotImplementedError

    def delete(self, chunk_ids: Sequence[Any]) -> None:
        raise NotImplementedError

    def clear(self, collection: str | None = None) -> None:
        raise NotImplementedError


def writes_supported(store: VectorStore) -> bool:
    """Whether ``store`` implements the three write methods (or needs none)."""
    if not store.receives_writes:
        return True
    return all(
        getattr(type(store), name) is not getattr(VectorStore, name)
        for name in ("store", "delete", "clear")
    )


def request_db(request) -> str:
    """The database ``request`` searches: its ``database``, else :func:`search_db`."""
    return getattr(request, "database", None) or search_db()


def collection_scope(request) -> list[int] | None:
    """The ids of the request's collections (None: all): those it carries once resolved
    (``request.collection_ids``), else read on the database searched; an unknown name raises
    :class:`UnknownCollection`."""
    if request.collections is None:
        return None
    resolved = getattr(request, "collection_ids", None)
    if resolved is not None:
        return list(resolved)
    ids = dict(
        Collection.objects.using(request_db(request))
        .filter(name__in=request.collections)
        .values_list("name", "pk")
    )
    for name in request.collections:
        if name not in ids:
            raise UnknownCollection(name)
    return sorted(set(ids.values()))


def scoped_chunks(request, collection_ids: Sequence[int] | None = None):
    """The chunks a request may return: its collections (an unknown name raises
    :class:`UnknownCollection`), source and metadata filters. Used by every search path.
    ``collection_ids``: the request's collections already resolved by
    :func:`collection_scope` (else the request's own, or one lookup). On the database the request searches (a replica, perhaps)."""
    chunks = Chunk.objects.using(request_db(request))
    if collection_ids is None:
        collection_ids = collection_scope(request)
    if collection_ids is not None:
        chunks = chunks.filter(collection_id__in=list(collection_ids))
    if request.source_id:
        chunks = chunks.filter(document__source_id=request.source_id)
    if request.metadata:
        chunks = chunks.filter(document__metadata__contains=request.metadata)
    return chunks


class PgVectorStore(VectorStore):
    """Searches the chunk table (HNSW, BM25 from the trigger-kept statistics, fusion).

    BM25 ranks with the statistics of the collections searched (all of them when the request
    names none); source and metadata filters keep those collection-level statistics. Every
    query runs on the request's ``database`` (a replica, perhaps) and none writes.
    """

    receives_writes = False

    def search(self, request):
        # SEARCH["STATEMENT_TIMEOUT"]: every statement below runs under it (SearchTimeout).
        with search_budget(request_db(request)):
            return self._search(request)

    def _search(self, request):
        scope = collection_scope(request)
        chunks = scoped_chunks(request, scope)
        ef_search = getattr(request, "hnsw_ef_search", None)
        if ef_search is not None:
            chunks = chunks.with_ef_search(ef_search)
        return implementation(request.mode).pg(chunks, request, scope)

    # The rows written by django_rag.store are this store's data: nothing to hand over.
    def store(self, chunks, vectors) -> None:
        pass

    def delete(self, chunk_ids) -> None:
        pass

    def clear(self, collection=None) -> None:
        pass


class MemoryVectorStore(VectorStore):
    """An in-process store with exact cosine search and BM25, for tests and small apps.

    Configured as ``VECTOR_STORE = "memory"`` it receives every write of the write path.
    Standalone, fill it with :meth:`add` (or ``ingest`` on
    :class:`django_rag.retrieval.MemoryVectorStore`, which chunks and embeds first).
    """

    def __init__(self):
        # chunk_id -> (entry with score 0, unit vector, tokens); a search returns scored copies.
        self._entries: dict[Any, tuple[SearchResult, np.ndarray, list[str]]] = {}
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
        entry = SearchResult(
            chunk_id=next(self._ids),
            text=text,
            score=0.0,
            collection=collection,
            source_id=source_id,
            **fields,
        )
        self.store([entry], [vector])
        return entry.chunk_id

    def store(self, chunks, vectors) -> None:
        with self._lock:
            for chunk, vector in zip(chunks, vectors, strict=True):
                array = np.asarray(vector, dtype=np.float32)
                known = next(iter(self._entries.values()), None)
                if known is not None and array.shape != known[1].shape:
                    raise ValueError(
                        f"vector has {array.shape[0]} dimensions; this store holds "
                        f"{known[1].shape[0]}"
                    )
                norm = float(np.linalg.norm(array))
                entry = replace(chunk, score=0.0, metadata=dict(chunk.metadata))
                self._entries[chunk.chunk_id] = (
                    entry,
                    array / norm if norm else array,
                    tokenize(chunk.text),
                )

    def delete(
        self, chunk_ids=None, *, collection: str | None = None, source_id: str | None = None
    ) -> int:
        """Remove chunks by id, or those matching ``collection``/``source_id``; returns how
        many were removed."""
        with self._lock:
            if chunk_ids is not None:
                doomed = [pk for pk in chunk_ids if pk in self._entries]
            else:
                doomed = [
                    pk
                    for pk, (entry, _, _) in self._entries.items()
                    if (collection is None or entry.collection == collection)
                    and (source_id is None or entry.source_id == source_id)
                ]
            for pk in doomed:
                del self._entries[pk]
        return len(doomed)

    def clear(self, collection: str | None = None) -> None:
        if collection is None:
            with self._lock:
                self._entries.clear()
        else:
            self.delete(collection=collection)

    def search(self, request):
        mode = implementation(request.mode)
        with self._lock:
            rows = list(self._entries.values())
        entries = [entry for entry, _, _ in rows]
        vectors = [vector for _, vector, _ in rows]
        tokens = [words for _, _, words in rows]
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
        if mode.uses_vector and selected:
            query = np.asarray(request.vector, dtype=np.float32)
            norm = float(np.linalg.norm(query))
            similarities = np.stack([vectors[i] for i in selected]) @ (
                query / norm if norm else query
            )
            for i, similarity in zip(selected, similarities, strict=True):
                results[i].semantic_score = float(similarity)
        matches: dict[int, float] = {}
        if mode.uses_text:
            # BM25 statistics of the collections searched (all when none is named), as in
            # PostgreSQL; source and metadata filters do not narrow them.
            searched = [
                i
                for i, e in enumerate(entries)
                if request.collections is None or e.collection in request.collections
            ]
            scores, excluded = bm25_scores(
                [tokens[i] for i in searched], request.query, syntax=request.syntax
            )
            matches = {searched[j]: score for j, score in scores.items()}
            for j in excluded:
                results.pop(searched[j], None)
            for i, result in results.items():
                result.fulltext_score = matches.get(i, 0.0)
        ranked = mode.memory(results, matches, request)
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
    documents: Sequence[Sequence[str]], query: str, *, syntax: str = "natural"
) -> tuple[dict[int, float], set[int]]:
    """BM25 of every tokenised document matching ``query`` read with ``syntax`` (as in
    PostgreSQL full-text mode), and the indexes of documents an ``-excluded`` word removes
    (websearch syntax only). In natural syntax a phrase the document holds adds the idf of
    its words, as in PostgreSQL."""
    free, phrases, excluded_words = split_query(query)
    if syntax == "natural":
        free, excluded_words = free + excluded_words, []
    phrase_tokens = [t for t in (tokenize(p) for p in phrases) if t]
    # How many times the query holds each word: weighed with SEARCH["BM25_K3"], as in SQL.
    occurrences = Counter(tokenize(" ".join(free))) + Counter(t for p in phrase_tokens for t in p)
    terms = set(occurrences)
    banned = set(tokenize(" ".join(excluded_words)))
    if not terms or not documents:
        return {}, set()
    k1 = float(search_setting("BM25_K1"))
    b = float(search_setting("BM25_B"))
    total = len(documents)
    average = max(sum(len(d) for d in documents) / total, 1.0)
    frequency = Counter(t for d in documents for t in set(d) & terms)

    def idf(term: str) -> float:
        return math.log(1 + (total - frequency[term] + 0.5) / (frequency[term] + 0.5))

    k3 = bm25_k3()
    weight = {t: idf(t) * query_term_weight(n, k3) for t, n in occurrences.items()}

    scores: dict[int, float] = {}
    excluded: set[int] = set()
    for index, document in enumerate(documents):
        if banned and banned & set(document):
            excluded.add(index)
            continue
        held = [p for p in phrase_tokens if _has_phrase(document, p)]
        if syntax == "websearch" and len(held) < len(phrase_tokens):
            continue
        counts = Counter(t for t in document if t in terms)
        if not counts:
            continue
        scores[index] = sum(
            weight[t] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(document) / average))
            for t, tf in counts.items()
        )
        if syntax == "natural":
            scores[index] += sum(sum(idf(t) for t in p) for p in held if len(p) > 1)
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


#: Store aliases of ``VECTOR_STORE``. ``"memory"`` names this layer's store; the retrieval
#: layer registers its subclass (which adds ``ingest``) over it when it loads (at app start),
#: so no alias here points up the layers.
ALIASES = {
    "pgvector": "django_rag.store.vector_stores.PgVectorStore",
    "memory": "django_rag.store.vector_stores.MemoryVectorStore",
}


def register_alias(name: str, path: str) -> None:
    """Make ``name`` a ``VECTOR_STORE`` alias of the class at dotted ``path`` (the built
    default is rebuilt on next use)."""
    ALIASES[name] = path
    _default.clear()


_default: list[VectorStore] = []


def get_vector_store(spec: Any = None) -> VectorStore:
    """The store for ``spec``, or the configured one (built once, so a memory store persists)."""
    if spec is not None:
        return build_component(spec, setting="VECTOR_STORE", base=VectorStore, aliases=ALIASES)
    if not _default:
        _default.append(get_vector_store(get_setting("VECTOR_STORE")))
    return _default[0]


on_reset(_default.clear)


# --- handing writes over ------------------------------------------------------------------------


def receiving_store() -> VectorStore | None:
    store = get_vector_store()
    return store if store.receives_writes else None


def sync_stored(chunks: Sequence[Chunk], *, document) -> None:
    """Hand newly stored chunks of ``document`` to the configured store."""
    store = receiving_store()
    if store is None or not chunks:
        return
    for chunk in chunks:  # already in memory: no query for what from_chunk reads
        chunk.document = document
    store.store(
        [SearchResult.from_chunk(chunk) for chunk in chunks],
        [list(chunk.embedding) for chunk in chunks],
    )


def sync_vectors(chunk_ids: Sequence[int], vectors: Sequence[Sequence[float]]) -> None:
    """Hand re-embedded chunks to the configured store."""
    store = receiving_store()
    if store is None or not chunk_ids:
        return
    rows = (
        Chunk.objects.using(write_db())  # just written: the primary has them, a replica may not
        .filter(pk__in=list(chunk_ids))
        .select_related("document", "collection")
    )
    by_id = {chunk.pk: chunk for chunk in rows.defer("embedding", "search_vector")}
    pairs = [
        (by_id[pk], vector) for pk, vector in zip(chunk_ids, vectors, strict=True) if pk in by_id
    ]
    store.store([SearchResult.from_chunk(c) for c, _ in pairs], [v for _, v in pairs])


def sync_all_vectors(batch_size: int = 1000) -> None:
    """Hand every chunk's vector to the configured store (after a model switch)."""
    if receiving_store() is None:
        return
    last = 0
    while rows := list(
        Chunk.objects.using(write_db())
        .filter(pk__gt=last)
        .order_by("pk")
        .values_list("pk", "embedding")[:batch_size]
    ):
        sync_vectors([pk for pk, _ in rows], [list(vector) for _, vector in rows])
        last = rows[-1][0]


def sync_deleted(chunk_ids: Sequence[int]) -> None:
    """Tell the configured store these chunks are gone."""
    store = receiving_store()
    if store is not None and chunk_ids:
        store.delete(list(chunk_ids))

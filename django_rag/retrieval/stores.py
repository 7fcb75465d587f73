"""Vector stores (defined in :mod:`django_rag.store.vector_stores`), and the memory store's
``ingest`` convenience, which chunks and embeds like the write path before storing."""

from __future__ import annotations

from typing import Unpack

from ..ingestion.parsers import ParsedDocument
from ..ingestion.prepare import prepare_chunks
from ..ingestion.request import IngestOptions, build_ingest_request
from ..store import vector_stores
from ..store.vector_stores import (  # noqa: F401
    ALIASES,
    PgVectorStore,
    VectorStore,
    bm25_scores,
    collection_scope,
    contains,
    get_vector_store,
    scoped_chunks,
    tokenize,
)
from ..validation import clean_text


class MemoryVectorStore(vector_stores.MemoryVectorStore):
    def ingest(self, text: str, **options: Unpack[IngestOptions]) -> list[int]:
        """Chunk and embed ``text`` exactly as database ingest does, with the same options
        (``collection`` default ``"default"``, ``title``, ``metadata``, ``source_id``,
        ``format``, ``chunker``, ``embedder``, ``chunk_size``, ``chunk_overlap``,
        ``on_chunk_error``; any other raises ``InvalidOption``); returns the chunk ids."""
        request = build_ingest_request("MemoryVectorStore.ingest", options)
        parsed = ParsedDocument(text=clean_text(text), format=request.format)
        prepared = prepare_chunks(
            parsed,
            chunker=request.chunker,
            embedder=request.embedder,
            on_error=request.on_chunk_error,
        )
        document_id = next(self._documents)
        metadata = request.metadata or {}
        return [
            self.add(
                item.embedding,
                text=item.chunk.text,
                collection=request.collection_name,
                source_id=request.source_id or "",
                document_id=document_id,
                chunk_index=item.chunk_index,
                metadata={**metadata, **item.chunk.metadata},
                title=request.title,
                start_char=item.chunk.start,
                end_char=item.chunk.end,
            )
            for item in prepared
        ]


# "memory" names the store with ingest (registered from this layer: the store layer's own
# alias table does not point up to it).
vector_stores.register_alias("memory", f"{__name__}.MemoryVectorStore")

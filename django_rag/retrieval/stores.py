"""Vector stores (defined in :mod:`django_rag.store.vector_stores`), and the memory store's
``ingest`` convenience, which chunks and embeds like the write path before storing."""

from __future__ import annotations

from ..embeddings import get_embedder
from ..ingestion.parsers import ParsedDocument
from ..ingestion.prepare import prepare_chunks
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
from ..validation import clean_metadata, clean_text


class MemoryVectorStore(vector_stores.MemoryVectorStore):
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


# "memory" names the store with ingest (registered from this layer: the store layer's own
# alias table does not point up to it).
vector_stores.register_alias("memory", f"{__name__}.MemoryVectorStore")

"""The one result type every search mode returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SearchResult:
    chunk_id: int | str
    text: str
    score: float
    document_id: int | str | None = None
    chunk_index: int | None = None
    collection: str = ""
    source_id: str = ""
    title: str = ""
    filename: str = ""
    page_start: int | None = None
    page_end: int | None = None
    start_char: int | None = None
    end_char: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    semantic_score: float | None = None
    fulltext_score: float | None = None
    rerank_score: float | None = None
    graph_score: float | None = None

    @property
    def label(self) -> str:
        """Where the chunk comes from, for people: file or title, and pages ("a.pdf p.3-4")."""
        where = self.filename or self.title or self.source_id or f"document {self.document_id}"
        if self.page_start is None:
            return where
        if self.page_end in (None, self.page_start):
            return f"{where} p.{self.page_start}"
        return f"{where} p.{self.page_start}-{self.page_end}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every field (the serialisation contract)."""
        return asdict(self)

    @classmethod
    def from_chunk(cls, chunk) -> SearchResult:
        document = chunk.document
        return cls(
            chunk_id=chunk.pk,
            text=chunk.text,
            score=chunk.score,
            document_id=chunk.document_id,
            chunk_index=chunk.chunk_index,
            collection=chunk.collection.name,
            source_id=document.source_id,
            title=document.title,
            filename=document.original_filename,
            page_start=chunk.page_start,
            page_end=chunk.page_end,
            start_char=chunk.start_char,
            end_char=chunk.end_char,
            metadata={**document.metadata, **chunk.metadata},
            semantic_score=getattr(chunk, "semantic_score", None),
            fulltext_score=getattr(chunk, "fulltext_score", None),
        )

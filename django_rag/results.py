"""Value types shared by every stage: search results, answers, citations, LLM usage.

They sit at the bottom of the package's layers: any module may import them, and they import
nothing of django_rag's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Usage:
    """Tokens and cost of one or more LLM calls. ``cost`` is None when no call had a known price."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost
        for model, figures in other.by_model.items():
            mine = self.by_model.setdefault(model, {})
            for key, value in figures.items():
                mine[key] = mine.get(key, 0) + value

    def __add__(self, other: Usage) -> Usage:
        total = Usage()
        total.add(self)
        total.add(other)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost": self.cost,
            "by_model": {model: dict(figures) for model, figures in self.by_model.items()},
        }

    @classmethod
    def of_call(
        cls, model: str, prompt_tokens: int, completion_tokens: int, cost: float | None
    ) -> Usage:
        figures = {
            "calls": 1,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
        }
        if cost is not None:
            figures["cost"] = cost
        return cls(1, prompt_tokens, completion_tokens, cost, {model: figures})


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
    # With context_window=k (django_rag.retrieval.context): the text of chunks
    # context_first..context_last of the document around this hit, and the ids of the other
    # hits whose windows overlapped this one's and were merged into it.
    context: str | None = None
    context_first: int | None = None
    context_last: int | None = None
    merged_chunk_ids: list[Any] = field(default_factory=list)
    # The model row a hit of a registered model comes from, once loaded by
    # django_rag.sync.with_objects (never serialised).
    object: Any = field(default=None, repr=False, compare=False)

    @property
    def passage(self) -> str:
        """What a reader (or an LLM's prompt) gets: the hit's window when the search returned
        one (``context_window``), else the chunk's own text."""
        return self.text if self.context is None else self.context

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
        """A JSON-ready dict with every field but ``object`` (the serialisation contract)."""
        return {
            item.name: copy.deepcopy(getattr(self, item.name))
            for item in fields(self)
            if item.name != "object"
        }

    @classmethod
    def from_chunk(cls, chunk) -> SearchResult:
        """The result for a stored chunk (with its document and collection loaded); its
        ``score`` and component scores when a search annotated them, else 0 / None."""
        document = chunk.document
        return cls(
            chunk_id=chunk.pk,
            text=chunk.text,
            score=getattr(chunk, "score", 0.0),
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


@dataclass
class Citation:
    """A numbered source the answer cites, resolved to its chunk and document."""

    number: int
    chunk: SearchResult

    @property
    def chunk_id(self):
        return self.chunk.chunk_id

    @property
    def document_id(self):
        return self.chunk.document_id

    @property
    def title(self) -> str:
        return self.chunk.title

    @property
    def filename(self) -> str:
        return self.chunk.filename

    @property
    def source_id(self) -> str:
        return self.chunk.source_id

    @property
    def page_start(self) -> int | None:
        return self.chunk.page_start

    @property
    def page_end(self) -> int | None:
        return self.chunk.page_end

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "title": self.title,
            "filename": self.filename,
            "source_id": self.source_id,
            "page_start": self.page_start,
            "page_end": self.page_end,
        }


VERDICTS = ("supported", "unsupported", "contradicted")


@dataclass
class GroundedSpan:
    """A stretch of an answer (``answer.text[start:end]``) and what the sources say of it.

    ``verdict`` is ``"supported"``, ``"unsupported"`` or ``"contradicted"``; ``chunk_ids`` are
    the chunks the grounder says support (or contradict) it; ``score`` is the grounder's
    confidence in the verdict (0-1) when it has one; ``sources`` are the chunks its words
    overlap, best first (``{"chunk_id", "score"}``, see
    :func:`~django_rag.answers.grounding.attribute`).
    """

    start: int
    end: int
    text: str
    verdict: str
    chunk_ids: list[Any] = field(default_factory=list)
    score: float | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "verdict": self.verdict,
            "chunk_ids": list(self.chunk_ids),
            "score": self.score,
            "sources": [dict(source) for source in self.sources],
        }


@dataclass
class Grounding:
    """How well an answer is supported by its sources.

    ``score`` (0-1, higher is more faithful): for the LLM judge the share of the answer's
    claims that are supported, for the sentence grounders the share of the sentences'
    characters; 1.0 when the answer claims nothing. ``spans`` cover the answer's sentences or
    claims in order; ``grounder`` names what judged them; ``warnings`` says what went wrong.
    A grounder that fails gives no ``Grounding`` at all (``answer.grounding`` is None).
    """

    score: float
    spans: list[GroundedSpan] = field(default_factory=list)
    grounder: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def unsupported(self) -> list[GroundedSpan]:
        """The spans not supported by any source (unsupported or contradicted)."""
        return [span for span in self.spans if span.verdict != "supported"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "spans": [span.to_dict() for span in self.spans],
            "grounder": self.grounder,
            "warnings": list(self.warnings),
        }


@dataclass
class Answer:
    """What :func:`ask` returns: the text, the chunks it was written from, citations, usage."""

    question: str
    text: str
    chunks: list[SearchResult] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    # With graph=True: the entities, relationships and community summaries given to the LLM.
    graph: dict[str, list] | None = None
    # With ground=...: which parts of the text the chunks support.
    grounding: Grounding | None = None
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text

    @property
    def cited_chunks(self) -> list[SearchResult]:
        return [citation.chunk for citation in self.citations]

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "text": self.text,
            "model": self.model,
            "chunks": [chunk.to_dict() for chunk in self.chunks],
            "citations": [citation.to_dict() for citation in self.citations],
            "usage": self.usage.to_dict(),
            "graph": None
            if self.graph is None
            else {
                "entities": [e.name for e in self.graph["entities"]],
                "relationships": [
                    [r.source.name, r.type, r.target.name] for r in self.graph["relationships"]
                ],
                "summaries": list(self.graph["summaries"]),
            },
            "grounding": None if self.grounding is None else self.grounding.to_dict(),
            "warnings": list(self.warnings),
        }

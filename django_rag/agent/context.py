"""The context object every agent step reads and updates."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..answers.service import Answer, Citation
from ..conf import deadline_setting
from ..exceptions import InvalidInput, InvalidOption, UnknownCollection
from ..llm import Usage
from ..models import Collection
from ..models.databases import search_db
from ..results import Grounding, SearchResult
from ..retrieval.service import check_search_options as check_options
from ..validation import clean_collection_names, clean_query

# What the agent sets itself on every search: never a search option of the caller's.
_OWN_OPTIONS = frozenset({"query", "limit", "threshold", "collection"})


def check_search_options(options: Mapping[str, Any], owner: str) -> None:
    """:func:`~django_rag.retrieval.service.check_search_options` less the options an agent
    sets itself on every search."""
    check_options(options, owner, own=_OWN_OPTIONS)


@dataclass
class Retrieval:
    """The chunks one query returned from one collection (None: every collection)."""

    question: str
    collection: str | None
    chunks: list[SearchResult]


@dataclass
class Context:
    """State of one agent run. Steps fill it in; nothing here is required but ``question``.

    ``llm`` is the default for every step (a step's own ``llm=`` wins); ``limit``,
    ``threshold`` and ``search_options`` (mode, fusion, reranker, metadata...) go to every
    search. When a step fails, ``error`` and ``failed_step`` are set and later steps return
    the context unchanged. Fallbacks taken after an LLM failure (for example ``decompose``
    using the original question) are listed in ``warnings``.

    ``scope`` is the collections searched when neither a step's own option nor ``select``
    names them (``Agent(collection=...)``; None: every collection); ``select`` offers only
    these. An unknown name raises :class:`~django_rag.exceptions.UnknownCollection` at once,
    and a search option :func:`~django_rag.search` does not take raises
    :class:`~django_rag.exceptions.InvalidOption`.

    ``deadline`` is the most seconds the run may take (default ``AGENT_DEADLINE``; counted
    from the context's creation on a monotonic clock). LLM calls get at most what is left;
    a step that would start after it is skipped, ``error`` becoming an
    :class:`~django_rag.llm.AgentTimeout`.
    """

    question: str
    llm: Any = None
    limit: int = 5
    threshold: float | None = None
    search_options: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None
    scope: list[str] | None = None
    # gate
    skip_retrieval: bool = False
    gate_reasoning: str | None = None
    # rewrite / expand / decompose
    rewritten_query: str | None = None
    expanded_query: str | None = None
    sub_questions: list[str] | None = None
    # select
    collections: list[str] | None = None
    selection_reasoning: str | None = None
    offered_collections: list[str] | None = None
    # search / reason
    results: list[Retrieval] = field(default_factory=list)
    searcher: Any = None
    search_scope: list[str | None] | None = None
    queries_tried: list[str] = field(default_factory=list)
    search_iterations: int = 0
    reason_iterations: int = 0
    # rerank
    rerank_scores: dict[Any, float] = field(default_factory=dict)
    # the chunks rerank dropped, with their ``rerank_score`` when the reranker gave one
    rerank_dropped: list[SearchResult] = field(default_factory=list)
    # answer
    answer: str | None = None
    citations: list[Citation] = field(default_factory=list)
    context_used: list[SearchResult] = field(default_factory=list)
    correction_count: int = 0
    corrections: list[dict[str, str]] = field(default_factory=list)
    # ground
    grounding: Grounding | None = None
    # bookkeeping
    error: Exception | None = None
    failed_step: str | None = None
    warnings: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    # The monotonic time the run must end by (None: no deadline).
    deadline_at: float | None = field(default=None, init=False, repr=False)
    # Collection name -> id, read once per name for the whole run (collection_ids()).
    _collection_ids: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def collection_ids(self, names: list[str], database: str | None = None) -> dict[str, int]:
        """The ids of collections ``names``, read in one query for the names not read
        before in this run (the scope is resolved once, as a :class:`~django_rag.Loop`
        does, not once per search). An unknown name raises
        :class:`~django_rag.exceptions.UnknownCollection`."""
        unread = [name for name in names if name not in self._collection_ids]
        if unread:
            self._collection_ids.update(
                Collection.objects.using(search_db(database))
                .filter(name__in=unread)
                .values_list("name", "pk")
            )
            missing = [name for name in unread if name not in self._collection_ids]
            if missing:
                raise UnknownCollection(missing[0])
        return {name: self._collection_ids[name] for name in names}

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise InvalidInput("The agent needs a non-empty question string.")
        # Bounded and valid before any step sends it to an LLM.
        self.question = clean_query(self.question)
        check_search_options(self.search_options, "Agent")
        if self.scope is not None:
            names = clean_collection_names(self.scope)
            if not names:
                raise InvalidOption("collection must be a name or a non-empty list of names")
            self.scope = list(dict.fromkeys(names))
            self.collection_ids(self.scope)
        if self.deadline is None:
            self.deadline = deadline_setting("AGENT_DEADLINE")
        elif (
            isinstance(self.deadline, bool)
            or not isinstance(self.deadline, int | float)
            or not self.deadline > 0
        ):
            raise InvalidOption(
                f"deadline must be a positive number of seconds, got {self.deadline!r}"
            )
        if self.deadline is not None:
            self.deadline_at = time.monotonic() + self.deadline

    @property
    def query(self) -> str:
        """The query searches use: expanded, else rewritten, else the question."""
        return self.expanded_query or self.rewritten_query or self.question

    @property
    def chunks(self) -> list[SearchResult]:
        """Every retrieved chunk once, in retrieval order (first occurrence wins)."""
        seen: set[Any] = set()
        unique = []
        for retrieval in self.results:
            for chunk in retrieval.chunks:
                if chunk.chunk_id not in seen:
                    seen.add(chunk.chunk_id)
                    unique.append(chunk)
        return unique

    def to_answer(self) -> Answer | None:
        """The result as an :class:`Answer` (as ``ask()`` returns), once ``answer`` ran."""
        if self.answer is None:
            return None
        return Answer(
            question=self.question,
            text=self.answer,
            chunks=list(self.context_used),
            citations=list(self.citations),
            usage=self.usage,
            grounding=self.grounding,
            warnings=list(self.warnings),
        )

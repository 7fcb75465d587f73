"""django_rag: retrieval-augmented generation on PostgreSQL + pgvector.

The public API is small::

    import django_rag as rag
    doc = rag.ingest("text", collection="docs", source_id="handbook", replace=True)
    doc = rag.ingest_file("manual.pdf", collection="docs")
    docs = rag.ingest_many([{"text": ..., "source_id": ...}, ...], collection="docs")
    report = rag.sync_folder("handbook/", collection="docs")   # the collection mirrors a folder
    hits = rag.search("how do refunds work", limit=5, collection="docs")
    query = rag.rewrite_query("hi! how do refunds work?", rewriter="rewrite")  # no search
    answer = rag.ask("How do refunds work?", collection="docs", llm="openai/gpt-4o-mini")
    reply = rag.chat("And for opened items?", conversation=conv, user=request.user)  # memory
    ctx = rag.Agent("Compare plan A and B").gate().search().rerank().answer().context
    result = rag.Loop("Compare plan A and B", collection="plans").run()   # tool-calling agent
    docs = rag.list_documents(collection="docs", limit=20)   # count_documents, get_document
    rag.summarize_communities(collection="docs")   # GraphRAG; summarize_community(entities, rels)
    rag.delete(doc)

    @rag.indexed(text=["title", "body"], where={"published": True})   # a model kept in sync
    class Article(models.Model): ...
    hits = rag.with_objects(rag.search("refunds"), user=request.user)  # hit.object: the row

Names are imported lazily so ``import django_rag`` works before Django is set up; the
``TYPE_CHECKING`` imports below name the same objects for type checkers and IDEs (a test keeps
them, ``_EXPORTS`` and ``__all__`` in step). The search code lives in ``django_rag.retrieval``:
a subpackage called ``search`` would replace the ``search()`` function on this module as soon
as it was imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports lazily
    from django_rag.agent import Agent as Agent
    from django_rag.agent import Loop as Loop
    from django_rag.answers.grounding import Grounder as Grounder
    from django_rag.answers.service import ask as ask
    from django_rag.conversations import chat as chat
    from django_rag.graph.communities import summarize_communities as summarize_communities
    from django_rag.graph.communities import summarize_community as summarize_community
    from django_rag.ingestion.documents import count_documents as count_documents
    from django_rag.ingestion.documents import get_document as get_document
    from django_rag.ingestion.documents import list_documents as list_documents
    from django_rag.ingestion.folders import sync_folder as sync_folder
    from django_rag.ingestion.service import delete as delete
    from django_rag.ingestion.service import ingest as ingest
    from django_rag.ingestion.service import ingest_bytes as ingest_bytes
    from django_rag.ingestion.service import ingest_file as ingest_file
    from django_rag.ingestion.service import ingest_many as ingest_many
    from django_rag.results import Answer as Answer
    from django_rag.results import GroundedSpan as GroundedSpan
    from django_rag.results import Grounding as Grounding
    from django_rag.retrieval.results import SearchResult as SearchResult
    from django_rag.retrieval.service import rewrite_query as rewrite_query
    from django_rag.retrieval.service import search as search
    from django_rag.sync import indexed as indexed
    from django_rag.sync import with_objects as with_objects

__version__ = "0.1.0"

_EXPORTS = {
    "ingest": "django_rag.ingestion.service",
    "ingest_file": "django_rag.ingestion.service",
    "ingest_bytes": "django_rag.ingestion.service",
    "ingest_many": "django_rag.ingestion.service",
    "sync_folder": "django_rag.ingestion.folders",
    "delete": "django_rag.ingestion.service",
    "list_documents": "django_rag.ingestion.documents",
    "count_documents": "django_rag.ingestion.documents",
    "get_document": "django_rag.ingestion.documents",
    "indexed": "django_rag.sync",
    "with_objects": "django_rag.sync",
    "search": "django_rag.retrieval.service",
    "rewrite_query": "django_rag.retrieval.service",
    "SearchResult": "django_rag.retrieval.results",
    "ask": "django_rag.answers.service",
    "chat": "django_rag.conversations",
    "Answer": "django_rag.results",
    "Agent": "django_rag.agent",
    "Loop": "django_rag.agent",
    "Grounder": "django_rag.answers.grounding",
    "Grounding": "django_rag.results",
    "GroundedSpan": "django_rag.results",
    "summarize_community": "django_rag.graph.communities",
    "summarize_communities": "django_rag.graph.communities",
}

# A literal, so type checkers read it; a test keeps it equal to sorted(_EXPORTS).
__all__ = [
    "Agent",
    "Answer",
    "GroundedSpan",
    "Grounder",
    "Grounding",
    "Loop",
    "SearchResult",
    "ask",
    "chat",
    "count_documents",
    "delete",
    "get_document",
    "indexed",
    "ingest",
    "ingest_bytes",
    "ingest_file",
    "ingest_many",
    "list_documents",
    "rewrite_query",
    "search",
    "summarize_communities",
    "summarize_community",
    "sync_folder",
    "with_objects",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'django_rag' has no attribute {name!r}")

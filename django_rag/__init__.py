"""django_rag: retrieval-augmented generation on PostgreSQL + pgvector.

The public API is small::

    import django_rag as rag
    doc = rag.ingest("text", collection="docs", source_id="handbook", replace=True)
    doc = rag.ingest_file("manual.pdf", collection="docs")
    docs = rag.ingest_many([{"text": ..., "source_id": ...}, ...], collection="docs")
    report = rag.sync_folder("handbook/", collection="docs")   # the collection mirrors a folder
    hits = rag.search("how do refunds work", limit=5, collection="docs")
    answer = rag.ask("How do refunds work?", collection="docs", llm="openai/gpt-4o-mini")
    ctx = rag.Agent("Compare plan A and B").gate().search().rerank().answer().context
    result = rag.Loop("Compare plan A and B", collection="plans").run()   # tool-calling agent
    rag.delete(doc)

    @rag.indexed(text=["title", "body"], where={"published": True})   # a model kept in sync
    class Article(models.Model): ...
    hits = rag.with_objects(rag.search("refunds"), user=request.user)  # hit.object: the row

Names are imported lazily so ``import django_rag`` works before Django is set up. The search
code lives in ``django_rag.retrieval``: a subpackage called ``search`` would replace the
``search()`` function on this module as soon as it was imported.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ingest": "django_rag.ingestion.service",
    "ingest_file": "django_rag.ingestion.service",
    "ingest_bytes": "django_rag.ingestion.service",
    "ingest_many": "django_rag.ingestion.service",
    "sync_folder": "django_rag.ingestion.folders",
    "delete": "django_rag.ingestion.service",
    "indexed": "django_rag.sync",
    "with_objects": "django_rag.sync",
    "search": "django_rag.retrieval.service",
    "SearchResult": "django_rag.retrieval.results",
    "ask": "django_rag.answers.service",
    "Answer": "django_rag.results",
    "Agent": "django_rag.agent",
    "Loop": "django_rag.agent",
    "Grounder": "django_rag.answers.grounding",
    "Grounding": "django_rag.results",
    "GroundedSpan": "django_rag.results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'django_rag' has no attribute {name!r}")

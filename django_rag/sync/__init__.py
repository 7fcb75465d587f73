"""Keep a Django project's own content indexed: registered models (signals + ``on_commit``,
``rag_sync`` for what signals cannot see). Folders are synced by
:func:`django_rag.ingestion` (``rag_ingest DIR --sync``). See docs/sync.md."""

from .declare import indexed, unregister
from .registry import IndexedModel, registered
from .service import SyncReport, reconcile, status, sync_row, with_objects

__all__ = [
    "IndexedModel",
    "SyncReport",
    "indexed",
    "reconcile",
    "registered",
    "status",
    "sync_row",
    "unregister",
    "with_objects",
]

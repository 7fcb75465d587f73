"""The store: the only code that writes documents, chunks and graph rows or alters the chunk
table. Every entry point (``ingest*``, ``ingest_many``, background ingestion, replace,
``delete``, the dashboard, the admin, re-embedding and the model switch) ends here.

- :mod:`.documents`: writing documents and their chunks (atomic writes, replace, dedup, batches;
  lock order);
- :mod:`.fences`: identities, their locks and version fences (the newest version wins);
- :mod:`.deletes`: deleting documents, chunks and identities;
- :mod:`.rows`: chunk rows and inserting them in few statements;
- :mod:`.transactions`: retrying a deadlocked write, folding statistics after commit;
- :mod:`.graph`: entities, mentions, relationships, communities;
- :mod:`.statistics`: the BM25 statistics (search vectors, deltas, compaction, recount);
- :mod:`.schema`: vectors in batches, the model switch's shadow column and swap, orphans;
- :mod:`.vector_stores`: the stores searches run on, and the hand-over of writes to them;
- :mod:`.uploads`: uploads waiting for their job (the pending document with the file's bytes).
"""

from .deletes import delete_document, delete_documents, delete_source
from .documents import DocumentWrite, mark_document, save_pending, write_document, write_documents
from .fences import next_versions, touch_source
from .rows import ChunkRow
from .statistics import compact_statistics, recount_statistics, recount_term_bounds

__all__ = [
    "ChunkRow",
    "DocumentWrite",
    "compact_statistics",
    "delete_document",
    "delete_documents",
    "delete_source",
    "mark_document",
    "next_versions",
    "recount_statistics",
    "recount_term_bounds",
    "save_pending",
    "touch_source",
    "write_document",
    "write_documents",
]

"""Dashboard views: thin wrappers over the library's services, scoped per user.

One module per page or group of pages; ``common`` holds what they share. Every view (and the
public names the single ``views`` module had) is importable from here, as ``urls.py`` does.
"""

from ...answers import ask  # the Ask pages call it through this name (see asking._library_ask)
from .asking import (
    NO_COLLECTION,
    TRAILER,
    ask_page,
    ask_stream,
)
from .collections import collections, delete_collection, save_collection
from .common import JOB_LIMIT, VERDICTS, grounded_segments
from .documents import (
    CHUNKS_PER_PAGE,
    build_document_graph,
    delete_document,
    document,
    documents,
    home,
    ingest_text,
    upload,
)
from .evaluation import (
    CHART_METRICS,
    EVALUATION_GROUNDERS,
    EVALUATION_JOBS,
    EVALUATION_RETRIEVERS,
    PLOT,
    evaluation,
    evaluation_jobs,
    evaluation_run,
)
from .graph import GRAPH_NEIGHBOURS, graph
from .info import info
from .jobs import CONFIRM_ACTIONS, JOB_STATUSES, MAINTENANCE_JOBS, jobs, maintenance, retry_job
from .search import search
from .sync import SYNC_JOBS, sync_page

__all__ = [
    "CHART_METRICS",
    "CHUNKS_PER_PAGE",
    "CONFIRM_ACTIONS",
    "EVALUATION_GROUNDERS",
    "EVALUATION_JOBS",
    "EVALUATION_RETRIEVERS",
    "GRAPH_NEIGHBOURS",
    "JOB_LIMIT",
    "JOB_STATUSES",
    "MAINTENANCE_JOBS",
    "NO_COLLECTION",
    "PLOT",
    "SYNC_JOBS",
    "TRAILER",
    "VERDICTS",
    "ask",
    "ask_page",
    "ask_stream",
    "build_document_graph",
    "collections",
    "delete_collection",
    "delete_document",
    "document",
    "documents",
    "evaluation",
    "evaluation_jobs",
    "evaluation_run",
    "graph",
    "grounded_segments",
    "home",
    "info",
    "ingest_text",
    "jobs",
    "maintenance",
    "retry_job",
    "save_collection",
    "search",
    "sync_page",
    "upload",
]
